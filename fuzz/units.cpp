// The unit and list parsers of the command line (core/units.h): the first byte picks the parser,
// the rest is the text. Each gives a value or an error that says why; a size or a duration it
// accepts formats into text that it reads back.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dlprobe/core/units.h"

namespace {

void says_why(const dlprobe::Status& s) {
  if (s.message().empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dlprobe;
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      if (auto v = parse_size(text, "--size")) {
        // format_size rounds to three digits; what it prints must still be a size.
        if (!parse_size(format_size(*v), "again")) std::abort();
        // A plain count of bytes is that count (to a double's precision).
        if (!text.empty() && text.size() < 32 &&
            text.find_first_not_of("0123456789") == std::string_view::npos) {
          const double count = std::strtod(std::string(text).c_str(), nullptr);
          if (std::abs(static_cast<double>(*v) - count) > 1 + 1e-12 * count) std::abort();
        }
      } else {
        says_why(v.status());
      }
      break;
    case 1:
      if (auto v = parse_duration(text, "--interval")) {
        // Under a minute it prints one number and a unit, which must read back ("2m05s" does not).
        if (v->count() < 60'000'000'000 && !parse_duration(format_duration(*v), "again")) {
          std::abort();
        }
      } else {
        says_why(v.status());
      }
      break;
    case 2:
      if (auto v = parse_list(text, "--batch")) {
        for (const std::string& item : *v) {
          if (item.empty()) std::abort();
        }
      } else {
        says_why(v.status());
      }
      break;
    case 3:
      if (auto v = parse_int(text, "--steps", -1000, 1'000'000)) {
        if (*v < -1000 || *v > 1'000'000) std::abort();
      } else {
        says_why(v.status());
      }
      break;
    case 4:
      if (auto v = parse_fraction(text, "--fraction")) {
        if (!(*v >= 0 && *v <= 1)) std::abort();
      } else {
        says_why(v.status());
      }
      break;
    default:
      (void)parse_cuda_index(text);
      break;
  }
  return 0;
}
