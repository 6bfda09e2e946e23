// A deterministic mutation driver for LLVMFuzzerTestOneInput targets, for the GCC build CI runs
// (libFuzzer needs clang's coverage instrumentation; the same targets link with it under clang,
// README.md). It runs every file of the corpus folders as it is, then mutations of them drawn from
// a fixed seed, until a time or run budget ends, and reports the executions and the corpus size.
// Without coverage feedback the corpus does not grow: the mutations stay close to the seeds, which
// is where a parser's bounds checks are (lengths, offsets, counts, nesting, number ranges).
//
// A crash is a sanitizer report, a signal or an oracle's abort; a hang is an input past --timeout.
// Either way the input is left in <--artifacts>/crash-input, to be replayed (`fuzz_<target> FILE`)
// and become a regression test.
//
// Written here because no Debian package offers a libFuzzer-compatible driver for GCC builds; it is
// a fuzzing loop and nothing else (AFL++ would need its own compiler wrappers and fork server).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

using Bytes = std::vector<std::uint8_t>;

struct Options {
  double seconds = 20;
  std::uint64_t runs = 0;  // 0: until the time is up
  std::uint64_t seed = 1;
  std::size_t max_len = 1 << 16;
  unsigned timeout = 10;  // seconds one input may take
  std::string artifacts = ".";
  std::string dict;
  std::vector<std::string> inputs;  // folders (a corpus) or files (replayed once)
};

// Each input is written to this file before it runs, and the file removed at a clean end: however
// the process dies (a sanitizer's exit, a signal, the test's timeout), the input that killed it is
// left there. Two system calls per input, against an in-process callback that not every way of
// dying calls (GCC's UBSan exits without the death callback).
int g_input_fd = -1;

void on_timeout(int) {
  static constexpr char kText[] = "fuzz: an input ran past its timeout\n";
  (void)!write(2, kText, sizeof kText - 1);
  _exit(70);
}

bool parse_flag(std::string_view arg, std::string_view name, std::string& value) {
  if (arg.substr(0, name.size()) != name || arg.size() <= name.size() || arg[name.size()] != '=') {
    return false;
  }
  value = std::string(arg.substr(name.size() + 1));
  return true;
}

Bytes read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// libFuzzer's dictionary format: one "token" per line (optionally name="token"), with \\, \" and
// \xNN escapes; # starts a comment.
std::vector<Bytes> read_dict(const std::string& path) {
  std::vector<Bytes> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t open = line.find('"');
    const std::size_t close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    Bytes token;
    for (std::size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        if (line[i + 1] == 'x' && i + 3 < close) {
          token.push_back(static_cast<std::uint8_t>(std::stoi(line.substr(i + 2, 2), nullptr, 16)));
          i += 3;
        } else {
          token.push_back(static_cast<std::uint8_t>(line[++i]));
        }
      } else {
        token.push_back(static_cast<std::uint8_t>(line[i]));
      }
    }
    if (!token.empty()) out.push_back(std::move(token));
  }
  return out;
}

class Mutator {
 public:
  Mutator(std::uint64_t seed, std::size_t max_len, const std::vector<Bytes>& corpus,
          std::vector<Bytes> dict)
      : rng_(seed), max_len_(max_len), corpus_(corpus), dict_(std::move(dict)) {
    // Numbers at the edges of the types a parser converts to, and where rounding carries into the
    // next digit (or unit).
    for (const char* n : {"0",
                          "-1",
                          "1",
                          "-0",
                          "255",
                          "256",
                          "65536",
                          "2147483647",
                          "2147483648",
                          "-2147483649",
                          "4294967295",
                          "4294967296",
                          "9223372036854775807",
                          "9223372036854775808",
                          "-9223372036854775808",
                          "18446744073709551615",
                          "18446744073709551616",
                          "1e308",
                          "1e309",
                          "-1e309",
                          "4.9e-324",
                          "1e-400",
                          "0.5",
                          "nan",
                          "inf",
                          "99999999999999999999999",
                          "999",
                          "999.95",
                          "999999",
                          "0.9995"}) {
      numbers_.emplace_back(n, n + std::strlen(n));
    }
  }

  Bytes next() {
    Bytes b = corpus_[below(corpus_.size())];
    const std::size_t count = 1 + below(8);
    for (std::size_t i = 0; i < count; ++i) mutate(b);
    if (b.size() > max_len_) b.resize(max_len_);
    return b;
  }

 private:
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng_() % n); }

  void insert(Bytes& b, const Bytes& what) {
    const auto at = static_cast<std::ptrdiff_t>(below(b.size() + 1));
    b.insert(b.begin() + at, what.begin(), what.end());
  }

  // A run of ASCII digits (with sign, point, exponent) replaced by an edge number.
  void replace_number(Bytes& b) {
    std::vector<std::size_t> starts;
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (std::isdigit(b[i]) != 0 && (i == 0 || std::isdigit(b[i - 1]) == 0)) starts.push_back(i);
    }
    const Bytes& n = numbers_[below(numbers_.size())];
    if (starts.empty()) {
      insert(b, n);
      return;
    }
    std::size_t begin = starts[below(starts.size())];
    if (begin > 0 && b[begin - 1] == '-') --begin;
    std::size_t end = begin + 1;
    while (end < b.size() && (std::isdigit(b[end]) != 0 ||
                              (b[end] != 0 && std::strchr(".eE+-", b[end]) != nullptr))) {
      ++end;
    }
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(begin),
            b.begin() + static_cast<std::ptrdiff_t>(end));
    b.insert(b.begin() + static_cast<std::ptrdiff_t>(begin), n.begin(), n.end());
  }

  void mutate(Bytes& b) {
    switch (below(10)) {
      case 0:  // flip a bit
        if (!b.empty()) b[below(b.size())] ^= static_cast<std::uint8_t>(1u << below(8));
        break;
      case 1:  // an interesting byte
        if (!b.empty()) {
          static constexpr std::uint8_t kBytes[] = {0,   1,   0x7f, 0x80, 0xff, '"',  '\\', '{',
                                                    '}', '[', ']',  ',',  ':',  '\n', ' '};
          b[below(b.size())] = kBytes[below(std::size(kBytes))];
        }
        break;
      case 2:  // a random byte inserted
        insert(b, Bytes{static_cast<std::uint8_t>(below(256))});
        break;
      case 3:  // a range erased
        if (!b.empty()) {
          const std::size_t at = below(b.size());
          const std::size_t n = 1 + below(std::min<std::size_t>(b.size() - at, 64));
          b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                  b.begin() + static_cast<std::ptrdiff_t>(at + n));
        }
        break;
      case 4:  // a range repeated
        if (!b.empty()) {
          const std::size_t at = below(b.size());
          const std::size_t n = 1 + below(std::min<std::size_t>(b.size() - at, 64));
          insert(b, Bytes(b.begin() + static_cast<std::ptrdiff_t>(at),
                          b.begin() + static_cast<std::ptrdiff_t>(at + n)));
        }
        break;
      case 5: {  // a piece of another input
        const Bytes& other = corpus_[below(corpus_.size())];
        if (!other.empty()) {
          const std::size_t at = below(other.size());
          const std::size_t n = 1 + below(std::min<std::size_t>(other.size() - at, 256));
          insert(b, Bytes(other.begin() + static_cast<std::ptrdiff_t>(at),
                          other.begin() + static_cast<std::ptrdiff_t>(at + n)));
        }
        break;
      }
      case 6:  // cut short
        if (!b.empty()) b.resize(below(b.size()));
        break;
      case 7:
      case 8:
        replace_number(b);
        break;
      default:  // a dictionary token
        if (!dict_.empty()) insert(b, dict_[below(dict_.size())]);
        break;
    }
  }

  std::mt19937_64 rng_;
  std::size_t max_len_;
  const std::vector<Bytes>& corpus_;
  std::vector<Bytes> dict_;
  std::vector<Bytes> numbers_;
};

void run_one(const Bytes& input, unsigned timeout) {
  if (g_input_fd >= 0) {
    (void)!pwrite(g_input_fd, input.data(), input.size(), 0);
    (void)!ftruncate(g_input_fd, static_cast<off_t>(input.size()));
  }
  alarm(timeout);
  LLVMFuzzerTestOneInput(input.data(), input.size());
  alarm(0);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string v;
    try {
      if (parse_flag(arg, "--seconds", v)) {
        o.seconds = std::stod(v);
      } else if (parse_flag(arg, "--runs", v)) {
        o.runs = std::stoull(v);
      } else if (parse_flag(arg, "--seed", v)) {
        o.seed = std::stoull(v);
      } else if (parse_flag(arg, "--max-len", v)) {
        o.max_len = std::stoull(v);
      } else if (parse_flag(arg, "--timeout", v)) {
        o.timeout = static_cast<unsigned>(std::stoul(v));
      } else if (parse_flag(arg, "--artifacts", v)) {
        o.artifacts = v;
      } else if (parse_flag(arg, "--dict", v)) {
        o.dict = v;
      } else if (arg.substr(0, 2) == "--") {
        std::fprintf(stderr, "fuzz: unknown flag %s\n", argv[i]);
        return 2;
      } else {
        o.inputs.emplace_back(arg);
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "fuzz: bad value in %s\n", argv[i]);
      return 2;
    }
  }
  const std::string input_file = o.artifacts + "/crash-input";
  g_input_fd = open(input_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (g_input_fd < 0) {
    std::fprintf(stderr, "fuzz: cannot write %s: %s\n", input_file.c_str(), std::strerror(errno));
    return 2;
  }
  signal(SIGALRM, on_timeout);

  std::vector<Bytes> corpus;
  std::size_t corpus_bytes = 0;
  bool replay_only = true;
  for (const std::string& input : o.inputs) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(input)) {
      replay_only = false;
      for (const auto& entry : std::filesystem::directory_iterator(input)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // the same order everywhere, for the same runs
    } else if (std::filesystem::is_regular_file(input)) {
      files.emplace_back(input);
    } else {
      std::fprintf(stderr, "fuzz: %s: no such file or folder\n", input.c_str());
      return 2;
    }
    for (const auto& f : files) {
      corpus.push_back(read_all(f));
      corpus_bytes += corpus.back().size();
    }
  }
  if (corpus.empty()) corpus.emplace_back();  // the empty input, at least
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t executions = 0;
  for (const Bytes& seed : corpus) {
    run_one(seed, o.timeout);
    ++executions;
  }
  if (!replay_only) {
    Mutator mutator(o.seed, o.max_len, corpus,
                    o.dict.empty() ? std::vector<Bytes>{} : read_dict(o.dict));
    const auto budget = std::chrono::duration<double>(o.seconds);
    while ((o.runs == 0 || executions < o.runs) &&
           std::chrono::steady_clock::now() - start < budget) {
      const Bytes input = mutator.next();
      run_one(input, o.timeout);
      ++executions;
    }
  }
  close(g_input_fd);
  unlink(input_file.c_str());
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "fuzz: %llu executions in %.1f s (%.0f/s), corpus %zu inputs (%zu bytes), seed %llu, "
      "0 crashes\n",
      static_cast<unsigned long long>(executions), elapsed,
      elapsed > 0 ? static_cast<double>(executions) / elapsed : 0.0, corpus.size(), corpus_bytes,
      static_cast<unsigned long long>(o.seed));
  return 0;
}
