// dlprobe bench as a user runs it: the binary, its exit code, stdout and stderr.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/run_dlprobe.h"
#include "dlprobe/results/results.h"

namespace {

using CliRun = dlprobe::testing::ProcessResult;
using dlprobe::testing::error_lines;

// Over-large requests must reach the caching allocator's out-of-memory report, not the
// sanitizer's allocation-size check; the options the suite runs under (scripts/test.sh) stay.
const dlprobe::testing::ProcessOptions kOptions{
    .env = {
        {"ASAN_OPTIONS",
         std::string(std::getenv("ASAN_OPTIONS") != nullptr ? std::getenv("ASAN_OPTIONS") : "") +
             ":allocator_may_return_null=1"}}};

CliRun run(const std::string& args, dlprobe::testing::ProcessOptions options = kOptions) {
  return dlprobe::testing::run_dlprobe(dlprobe::testing::split_args("bench " + args),
                                       std::move(options));
}

void expect_error(const std::string& args, const std::string& needle) {
  const CliRun r = run(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

const std::string kBase = "--device cpu --model resnet18 --width 16 --image-size 32 --classes 10 ";
const std::string kSmall = kBase + "--batch 2 ";

TEST(BenchCliTest, RefusesBadInputWithOneLine) {
  expect_error("--device cpu --model resnet51", "unknown model 'resnet51'");
  expect_error(kSmall + "--precision fp8", "unknown precision 'fp8'");
  expect_error(kSmall + "--mode eval", "unknown mode 'eval'");
  expect_error(kSmall + "--layout chwn", "unknown layout 'chwn'");
  expect_error(kSmall + "--optimizer lamb", "unknown optimizer 'lamb'");
  expect_error(kSmall + "--mode infer,grads --optimizer adamw",
               "--optimizer: only with --mode train (the optimizer's update)");
  expect_error(kSmall + "--batch-start 4",
               "--batch-start and --batch-limit: only with --batch auto");
  expect_error("--model resnet18 --device tpu:0", "--device: unknown device 'tpu:0'");
  expect_error(kSmall + "--batch 0", "--batch");
  expect_error(kSmall + "--data /nonexistent/jpegs", "/nonexistent/jpegs");
  expect_error(kSmall + "--data-threads 4", "only with --data DIR");
  expect_error(kSmall + "--data /tmp --data-decode gpu",
               "--data-decode gpu: needs a CUDA --device");
  expect_error(kSmall + "--data /tmp --data-decode disk", "--data-decode: unknown choice 'disk'");
  expect_error(kSmall + "--data-gpu-pixels ycbcr", "only with --data DIR");
  expect_error(kSmall + "--data /tmp --data-gpu-pixels ycbcr",
               "--data-gpu-pixels ycbcr: only when the images are decoded on the GPU (a CUDA "
               "--device with --data-decode gpu or auto)");
  expect_error(kSmall + "--data /tmp --data-gpu-pixels yuv",
               "--data-gpu-pixels: unknown choice 'yuv' (rgb or ycbcr)");
  expect_error(kSmall + "--image-size 0", "--image-size");
  expect_error(kSmall + "--recompute outputs",
               "--recompute: unknown choice 'outputs' (expected none or block-outputs)");
  expect_error(kSmall + "--recompute block-outputs --streams 2",
               "--streams: 2 keeps the outputs --recompute block-outputs would save");
  expect_error(kSmall + "--streams 1 --stream-lag 4",
               "--stream-lag bounds the second stream: it needs --streams 2 or auto");
  expect_error(kSmall + "--stream-lag -1", "--stream-lag (auto, or calls: 0 for no bound)");
  expect_error(kSmall + "--stream-lag some", "--stream-lag (auto, or calls: 0 for no bound)");
  expect_error(kSmall + "--steps 0", "--steps");
  expect_error(kSmall + "--batch two", "--batch");
  // One image of 16x16 leaves layer3's batch norm a single value per channel.
  expect_error("--device cpu --model resnet18 --image-size 16 --batch 1", "cannot take 16x16");
  expect_error(kSmall + "--weights /nonexistent/w.safetensors", "cannot open");
  expect_error(
      kSmall + "--conv-algo fastest",
      "--conv-algo: unknown choice 'fastest' (expected heuristic, autotune or exhaustive)");
  expect_error(kSmall + "--tuning-cache /nonexistent/dir/tuning.json",
               "--tuning-cache: /nonexistent/dir/tuning.json");
  expect_error(kSmall + "--tuning-cache -", "--tuning-cache -: ");
  // An empty value (an unset variable in a script) would read as the option left out.
  for (const char* option :
       {"--json", "--weights", "--tuning-cache", "--warmup-time", "--history"}) {
    expect_error(kSmall + option + " ''",
                 std::string(option) + ": an empty value (give one, or leave the option out)");
  }
}

// A value with a line break or another control character in it (a pasted value, a script's
// variable) is quoted in the error escaped, so that the error stays one line.
TEST(BenchCliTest, AControlCharacterInAValueKeepsTheErrorOneLine) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"bench", "--device", "cpu", "--layout", "nc\nhw"},
        std::vector<std::string>{"bench", "--device", "cpu", "--steps", "\t\r\x01"},
        std::vector<std::string>{"bench", "--no-such\nflag"}}) {
    const CliRun r = dlprobe::testing::run_dlprobe(args, kOptions);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(error_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
  const CliRun r =
      dlprobe::testing::run_dlprobe({"bench", "--device", "cpu", "--layout", "nc\nhw"}, kOptions);
  EXPECT_NE(r.err.find("'nc\\nhw'"), std::string::npos) << r.err;
}

// An output that cannot be written (a full device) fails the run before it measures, and the run
// leaves the other outputs as they were: a results file that existed keeps its content, and one it
// would have created is not left behind.
TEST(BenchCliTest, AnOutputThatFailsFirstLeavesTheOthersAsTheyWere) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const std::string dir = ::testing::TempDir() + "bench_cli_full_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string kept = dir + "/kept.json";
  std::ofstream(kept) << "what an earlier run wrote";
  const std::string quick = kSmall + "--mode infer --steps 1 --min-time 0s --warmup 0 ";
  const CliRun over = run(quick + "--json " + kept + " --md /dev/full --overwrite");
  EXPECT_NE(over.exit_code, 0) << over.output;
  EXPECT_NE(over.output.find("/dev/full: cannot write"), std::string::npos) << over.output;
  std::ifstream in(kept);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "what an earlier run wrote");
  const std::string fresh = dir + "/fresh.json";
  const CliRun made =
      run(quick + "--json " + fresh + " --csv " + dir + "/fresh.csv --md /dev/full");
  EXPECT_NE(made.exit_code, 0) << made.output;
  EXPECT_FALSE(std::filesystem::exists(fresh));
  EXPECT_FALSE(std::filesystem::exists(dir + "/fresh.csv"));
  std::filesystem::remove_all(dir);
}

// A tuning cache that is not one is refused before anything runs; a new one is created at once
// (the CPU backends have no convolution engines to tune, so it stays empty there).
TEST(BenchCliTest, TuningCacheIsCheckedAndCreatedBeforeTheRun) {
  const std::string dir = ::testing::TempDir() + "bench_cli_tuning_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string bad = dir + "/results.json";
  std::ofstream(bad) << R"({"schema": "dlprobe.results", "version": 1})";
  expect_error(kSmall + "--tuning-cache " + bad, "not a dlprobe tuning cache");
  const std::string fresh = dir + "/tuning.json";
  const CliRun r = run(kSmall +
                       "--mode infer --steps 1 --min-time 0s --warmup 0 --warmup-time 0s "
                       "--conv-algo exhaustive --tuning-cache " +
                       fresh);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(fresh);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"schema\": \"dlprobe.conv-tuning\""), std::string::npos)
      << text.str();
  std::filesystem::remove_all(dir);
}

TEST(BenchCliTest, WeightsThatDoNotFitNameTheTensor) {
  const std::string path = ::testing::TempDir() + "bench_cli_bad.safetensors";
  {
    // A valid file holding one tensor the model does not have.
    const std::string header = R"({"fc.extra":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
    std::ofstream out(path, std::ios::binary);
    const std::uint64_t n = padded.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << padded;
    out.write("\0\0\0\0", 4);
  }
  expect_error(kSmall + "--weights " + path, "fc.extra");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "not a safetensors file";
  }
  expect_error(kSmall + "--weights " + path, "safetensors");
}

TEST(BenchCliTest, OutOfMemoryIsTheAllocatorsReport) {
  // The reference backend: under the sanitizers LeakSanitizer's exit-time scan crashes over
  // OpenMP's idle threads after ASan refused a 55 TiB allocation; any backend gives this report.
  const std::string args = "--device cpu --backend reference --model resnet18 --batch 100000000";
  expect_error(args, "cannot allocate");
  const CliRun r = run(args);
  EXPECT_NE(r.output.find("images"), std::string::npos) << r.output;  // the owner
  EXPECT_NE(r.output.find("input"), std::string::npos) << r.output;   // the category
}

TEST(BenchCliTest, RefusesBadSweepsWithOneLine) {
  expect_error(kBase + "--batch 2,2", "'2' is given twice");
  expect_error(kBase + "--batch 2,02", "--batch: '2' and '02' are the same");
  expect_error("--device cpu --model resnet18 --image-size 65536 --batch 1099511627776",
               "overflows 64 bits");
  expect_error(kBase + "--batch 2,,4", "empty item");
  expect_error(kBase + "--batch auto --batch-start 64 --batch-limit 32", "--batch-limit");
  expect_error(kSmall + "--precision fp32,fp8", "unknown precision 'fp8'");
  expect_error(kSmall + "--mode train,eval", "unknown mode 'eval'");
  expect_error(kSmall + "--repeat 0", "--repeat");
  expect_error(kSmall + "--windows 0", "--windows");
  expect_error(kSmall + "--warmup soon", "--warmup (auto or a step count)");
  expect_error(kSmall + "--min-time 2", "--min-time");  // a bare number has no unit
  expect_error(kSmall + "--warmup-time -1s", "--warmup-time");
  expect_error(kSmall + "--backend cuda", "--backend: backend cuda does not run on cpu");
  expect_error(kSmall + "--backend tpu", "--backend: unknown backend 'tpu'");
  expect_error(kSmall + "--precision fp64",
               "--precision: precision fp64 runs on the reference backend (cpu) only");
  expect_error(kSmall + "--precision fp32,tf32", "tf32 is a GPU tensor-core mode");
  expect_error(kBase + "--batch 2,4 --profile 3", "--profile");
  expect_error("--device cpu --model resnet18,resnet34 --weights w.safetensors", "--weights");
  expect_error(kSmall + "--json /nonexistent/dir/r.json", "/nonexistent/dir/r.json");
  expect_error(kSmall + "--conv-engines fft", "--conv-engines: unknown choice 'fft'");
  expect_error(kSmall + "--conv-sums cudnn",
               "--conv-sums: unknown choice 'cudnn' (expected epilogue, pass or auto)");
  expect_error(
      kSmall + "--conv-prologue apart",
      "--conv-prologue: unknown choice 'apart' (expected fused, pass, auto, timed or up-to:SIZE)");
  expect_error(kSmall + "--stem-backward both",
               "--stem-backward: unknown choice 'both' (expected apart or fused)");
  expect_error(kSmall + "--graph maybe", "--graph: unknown choice 'maybe'");
  // The graph, the streams and the memory are judged together: the refusal names what was asked.
  expect_error(kSmall + "--mode infer --graph --gpu-memory grow",
               "--graph on, --gpu-memory grow: a graph needs the planned memory");
  expect_error(kSmall + "--streams 2", "--streams 2: a second stream needs the planned memory");
  expect_error(kSmall + "--layout auto,nhwc", "--layout");
  // Unknown flags are CLI11's errors, still one line.
  expect_error(kSmall + "--no-such-flag", "--no-such-flag");
}

TEST(BenchCliTest, OutOfMemoryInASweepIsRecordedAndTheSweepGoesOn) {
  const std::string json = ::testing::TempDir() + "bench_cli_oom.json";
  const CliRun r = run(kBase +
                       "--backend reference --mode infer --batch 2,100000000,4 --steps 1 "
                       "--min-time 0s --warmup 0 --warmup-time 0s -q --json " +
                       json);
  EXPECT_EQ(r.exit_code, 1) << r.output;  // incomplete, but measured
  EXPECT_EQ(error_lines(r.output), 0) << r.output;
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 3u);
  EXPECT_EQ(doc->configurations[0].status, dlprobe::results::RunStatus::ok);
  EXPECT_EQ(doc->configurations[1].status, dlprobe::results::RunStatus::oom);
  EXPECT_NE(doc->configurations[1].error.find("cannot allocate"), std::string::npos);
  EXPECT_EQ(doc->configurations[2].status, dlprobe::results::RunStatus::ok);
  // The table says so too.
  EXPECT_NE(r.output.find("did not finish:"), std::string::npos) << r.output;
  std::filesystem::remove(json);
}

// A configuration of a sweep runs what it runs alone: on oneDNN, NHWC after NCHW over 1x1 images
// (ResNet-18's last layers at 32x32) took NCHW's primitives from oneDNN's process-wide cache, and
// with them another workspace and peak.
TEST(BenchCliTest, ALayoutRunsAloneAsAfterAnother) {
  const std::string quick =
      kSmall + "--mode grads --steps 1 --min-time 0s --warmup 0 --warmup-time 0s -q --no-history ";
  const std::string alone_json = ::testing::TempDir() + "bench_cli_layout_alone.json";
  const std::string after_json = ::testing::TempDir() + "bench_cli_layout_after.json";
  const CliRun alone = run(quick + "--layout nhwc --overwrite --json " + alone_json);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const CliRun after = run(quick + "--layout nchw,nhwc --overwrite --json " + after_json);
  ASSERT_EQ(after.exit_code, 0) << after.output;
  const auto first = dlprobe::results::read_file(alone_json);
  const auto second = dlprobe::results::read_file(after_json);
  ASSERT_TRUE(first.has_value() && second.has_value());
  ASSERT_EQ(second->configurations.size(), 2u);
  const auto& a = first->configurations.front();
  const auto& b = second->configurations.back();
  if (a.settings.backend != "onednn") GTEST_SKIP() << "built without oneDNN";
  ASSERT_EQ(b.settings.layout, "nhwc");
  ASSERT_TRUE(a.memory.has_value() && b.memory.has_value());
  EXPECT_EQ(a.memory->allocator_stats["allocated_bytes.all.peak"],
            b.memory->allocator_stats["allocated_bytes.all.peak"]);
  std::filesystem::remove(alone_json);
  std::filesystem::remove(after_json);
}

// -v belongs to dlprobe, not to bench, yet it is taken where a user writes it: after the command.
TEST(BenchCliTest, VerboseIsTakenAfterTheCommandToo) {
  const std::string quick =
      kSmall + "--mode infer --steps 1 --min-time 0s --warmup 0 --warmup-time 0s -q --no-history ";
  for (const char* flag : {"-v", "--verbose"}) {
    const CliRun r = run(quick + flag);
    EXPECT_EQ(r.exit_code, 0) << flag << "\n" << r.output;
    EXPECT_NE(r.err.find("dlprobe debug: "), std::string::npos) << flag << "\n" << r.output;
  }
  const CliRun quiet = run(quick);
  EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.err.find("dlprobe debug: "), std::string::npos) << quiet.output;
}

// --recompute block-outputs is recorded where the step recomputed (the reference backend runs
// batch norm inside the convolutions in fp64 NHWC) and not where it had nothing to recompute
// (fp32), which a warning says.
TEST(BenchCliTest, RecomputeIsRecordedWhereItRan) {
  const std::string json = ::testing::TempDir() + "bench_cli_recompute.json";
  const CliRun r = run(kSmall +
                       "--backend reference --precision fp64,fp32 --layout nhwc --mode grads "
                       "--recompute block-outputs --steps 1 --min-time 0s --warmup 0 "
                       "--warmup-time 0s --json " +
                       json);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 2u);
  EXPECT_EQ(doc->configurations[0].settings.precision, "fp64");
  EXPECT_EQ(doc->configurations[0].settings.recompute, "block-outputs");
  EXPECT_EQ(doc->configurations[1].settings.precision, "fp32");
  EXPECT_EQ(doc->configurations[1].settings.recompute, "");
  EXPECT_NE(r.output.find("fp32 NHWC: the step keeps its block outputs"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("fp64 NHWC: the step keeps"), std::string::npos) << r.output;
  std::filesystem::remove(json);
}

TEST(BenchCliTest, AutoBatchEndsAtTheFirstOutOfMemoryAndSucceeds) {
  const std::string json = ::testing::TempDir() + "bench_cli_auto.json";
  // The walk's first batch is already too large: one configuration, out of memory, exit 0.
  const CliRun r = run(kBase +
                       "--backend reference --mode infer --batch auto --batch-start "
                       "100000000 --batch-limit 400000000 --steps 1 --warmup 0 -q --json " +
                       json);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  EXPECT_EQ(doc->configurations[0].status, dlprobe::results::RunStatus::oom);
  std::filesystem::remove(json);
}

// Reads what the child writes to the terminal into `seen` until `needle` shows (true), the child
// closes its side (false; an empty needle reads to that end) or the deadline passes (false).
bool read_until(int terminal, std::string& seen, std::string_view needle,
                std::chrono::seconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::array<char, 4096> buffer{};
  while (needle.empty() || seen.find(needle) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{terminal, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::read(terminal, buffer.data(), buffer.size());
    if (n <= 0) return false;  // EIO: the child closed its side
    seen.append(buffer.data(), static_cast<std::size_t>(n));
  }
  return true;
}

TEST(BenchCliTest, CtrlCKeepsWhatWasMeasured) {
  const std::string json = ::testing::TempDir() + "bench_cli_interrupt.json";
  std::filesystem::remove(json);
  // stderr on a terminal, so that bench draws its progress line: Ctrl-C comes once it shows the
  // first timed window, however slow the machine is.
  int terminal = -1;
  int child_side = -1;
  ASSERT_EQ(::openpty(&terminal, &child_side, nullptr, nullptr, nullptr), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(terminal);
    ::dup2(child_side, STDERR_FILENO);
    ::close(child_side);
    // The first configuration would time for a minute.
    const std::string command =
        "exec " DLPROBE_BINARY " bench " + kBase +
        "--backend reference --mode infer --batch 2,4 --steps 1000000 --min-time 60s --warmup 0 "
        "--warmup-time 0s --json " +
        json + " >/dev/null";
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(child_side);
  std::string seen;
  const bool timing = read_until(terminal, seen, "window 1 step", std::chrono::seconds(300));
  kill(pid, SIGINT);
  read_until(terminal, seen, "", std::chrono::seconds(300));
  ::close(terminal);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(timing) << seen;
  ASSERT_TRUE(WIFEXITED(status)) << seen;
  EXPECT_EQ(WEXITSTATUS(status), 1) << seen;
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);  // the second never started
  const auto& c = doc->configurations[0];
  EXPECT_EQ(c.status, dlprobe::results::RunStatus::interrupted);
  EXPECT_GT(c.samples.step_seconds.size(), 0u) << seen;
  EXPECT_TRUE(c.statistics.has_value());
  EXPECT_NE(seen.find("interrupted; what was measured is kept"), std::string::npos) << seen;
  std::filesystem::remove(json);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Ctrl-C at random moments of a CPU sweep, many times over: dlprobe ends by itself, 1 when it was
// interrupted and 0 when it had finished, with a valid results file that keeps what was measured;
// or, when the signal came before the bench began, by the signal. Never by a crash.
TEST(BenchCliTest, CtrlCAtRandomMomentsEndsCleanly) {
  const std::string dir = ::testing::TempDir() + "bench_cli_ctrl_c_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string json = dir + "/r.json";
  const std::string log = dir + "/log";
  std::mt19937 random(20261203);
  std::uniform_int_distribution<int> delay_ms(200, 3000);
  int tries = 0;
  int interrupted = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(12);
  while (std::chrono::steady_clock::now() < end) {
    std::filesystem::remove(json);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Ctrl-C as a terminal delivers it, whatever disposition the test runner was given.
      signal(SIGINT, SIG_DFL);
      const std::string command = "exec " DLPROBE_BINARY " bench " + kBase +
                                  "--batch 2,4,8 --steps 1 --warmup 0 --warmup-time 0s "
                                  "--min-time 300ms --json " +
                                  json + " >" + log + " 2>&1";
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(random)));
    kill(pid, SIGINT);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ++tries;
    const std::string output = file_text(log);
    if (WIFSIGNALED(status)) {
      // Before the bench began, Ctrl-C ends the process as it ends any other.
      ASSERT_EQ(WTERMSIG(status), SIGINT) << "try " << tries << "\n" << output;
      ASSERT_EQ(output.find("dlprobe bench: 1 "), std::string::npos) << output;
      continue;
    }
    ASSERT_TRUE(WIFEXITED(status));
    const int code = WEXITSTATUS(status);
    ASSERT_TRUE(code == 0 || code == 1) << "try " << tries << ": exit " << code << "\n" << output;
    auto doc = dlprobe::results::read_file(json);
    ASSERT_TRUE(doc.has_value()) << doc.status().message() << "\n" << output;
    if (code == 0) {
      ASSERT_EQ(doc->configurations.size(), 3u) << output;
      continue;
    }
    ++interrupted;
    ASSERT_NE(output.find("interrupted; what was measured is kept"), std::string::npos) << output;
    // Every configuration begun is in the file (the one cut short as interrupted) and on stderr.
    const auto& configurations = doc->configurations;
    for (std::size_t i = 0; i < configurations.size(); ++i) {
      const bool last = i + 1 == configurations.size();
      EXPECT_TRUE(configurations[i].status == dlprobe::results::RunStatus::ok ||
                  (last && configurations[i].status == dlprobe::results::RunStatus::interrupted))
          << output;
      EXPECT_NE(output.find("[" + std::to_string(i + 1) + "/3] "), std::string::npos) << output;
    }
    EXPECT_EQ(output.find("[" + std::to_string(configurations.size() + 1) + "/3] "),
              std::string::npos)
        << output;
  }
  std::filesystem::remove_all(dir);
  EXPECT_GT(interrupted, 0) << tries << " tries";
}

// --profile keeps every call of the step in the results file, in the step's order, beside the
// text's slowest calls; without it the file has no profile.
TEST(BenchCliTest, TheProfileIsKeptInTheResultsFile) {
  const std::string json = ::testing::TempDir() + "bench_cli_profile.json";
  CliRun r = run(kSmall + "--mode grads --steps 2 --min-time 0s --warmup 1 --warmup-time 0s " +
                 "--profile 2 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("slowest calls:"), std::string::npos) << r.output;
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_TRUE(doc->configurations[0].profile.has_value());
  const auto& calls = *doc->configurations[0].profile;
  ASSERT_GT(calls.size(), 10u);
  double total = 0;
  for (const auto& call : calls) {
    EXPECT_FALSE(call.name.empty());
    total += call.ms;
  }
  EXPECT_GT(total, 0);
  // Each call is named in the text's slowest list by the same name as in the file.
  const auto slowest = std::max_element(calls.begin(), calls.end(),
                                        [](const auto& a, const auto& b) { return a.ms < b.ms; });
  EXPECT_NE(r.output.find(slowest->name), std::string::npos) << slowest->name << "\n" << r.output;
  r = run(kSmall +
          "--mode grads --steps 2 --min-time 0s --warmup 1 --warmup-time 0s --overwrite --json " +
          json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  EXPECT_FALSE(doc->configurations[0].profile.has_value());
  std::filesystem::remove(json);
}

// With --repeat each run profiles; the text prints the profile the file keeps (the last run's),
// to the figure, not the first run's.
TEST(BenchCliTest, TheProfilePrintedIsTheOneKept) {
  const std::string json = ::testing::TempDir() + "bench_cli_profile_repeat.json";
  const CliRun r = run(kSmall +
                       "--mode grads --steps 2 --min-time 0s --warmup 1 --warmup-time 0s "
                       "--repeat 3 --profile 2 --overwrite --json " +
                       json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_TRUE(doc->configurations[0].profile.has_value());
  double total = 0;
  for (const auto& kind : dlprobe::results::time_by_kind(*doc->configurations[0].profile)) {
    total += kind.ms;
  }
  EXPECT_NE(r.output.find(fmt::format("profile     {:.3f} ms per step", total)), std::string::npos)
      << total << "\n"
      << r.output;
  std::filesystem::remove(json);
}

TEST(BenchCliTest, SingleConfigurationInDetail) {
  const CliRun r = run(kSmall +
                       "--mode infer --steps 3 --min-time 0s --warmup 1 --warmup-time 0s "
                       "--windows 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"throughput ", "windows ", "step time   median", "compute ",
                           "peak memory", "protocol    setup", "warm-up 1 steps in", ", fixed;"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
}

// The default warm-up runs until steady and says so; --repeat runs from scratch and prints the
// spread between runs beside the interval within the steps, each named.
TEST(BenchCliTest, SteadyWarmupAndRunsFromScratch) {
  const CliRun r = run(kSmall + "--mode infer --steps 3 --min-time 0s --repeat 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {", steady", "in the first of 3 runs", "3 runs from scratch",
                           "within the steps)", "between runs 95% t interval"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
}

// --repeat-process: the whole measurement in fresh processes, merged into one results file with a
// run per process and the spread between them named as theirs. A process whose sweep did not
// finish (a batch that cannot fit) is said, and what it measured kept.
TEST(BenchCliTest, RepeatProcessRunsTheMeasurementInFreshProcesses) {
  const std::string json = ::testing::TempDir() + "bench_cli_processes.json";
  const std::string quick = kSmall + "--mode infer --steps 2 --min-time 0s --warmup 0 ";
  const CliRun r = run(quick + "--repeat-process 2 --overwrite --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"dlprobe bench: process 2 of 2", "2 of 2 ended well",
                           "within the steps)", "between processes 95% t interval"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  auto doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 1u);
  const auto& c = doc->configurations[0];
  EXPECT_EQ(c.samples.run_steps, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(c.runs_in, dlprobe::results::RunsIn::processes);
  ASSERT_TRUE(c.run_spread.has_value());
  EXPECT_EQ(c.run_spread->runs, 2u);
  const auto& args = doc->context.command_line;
  EXPECT_NE(std::find(args.begin(), args.end(), "--repeat-process"), args.end());

  const CliRun oom = run(kBase +
                         "--backend reference --mode infer --batch 2,100000000 --steps 1 "
                         "--min-time 0s --warmup 0 --repeat-process 2 --overwrite --json=" +
                         json);
  EXPECT_EQ(oom.exit_code, 1) << oom.output;
  EXPECT_NE(oom.output.find("process 1 of 2 ended with exit 1; what it measured is kept"),
            std::string::npos)
      << oom.output;
  doc = dlprobe::results::read_file(json);
  ASSERT_TRUE(doc.has_value()) << doc.status().message();
  ASSERT_EQ(doc->configurations.size(), 2u);
  EXPECT_EQ(doc->configurations[0].samples.run_steps, (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(doc->configurations[1].status, dlprobe::results::RunStatus::oom);
  std::filesystem::remove(json);
  expect_error(quick + "--repeat-process 0", "--repeat-process");
  // No folder for the processes' results: one line, where the throwing call had aborted.
  dlprobe::testing::ProcessOptions no_tmp = kOptions;
  no_tmp.env.emplace_back("TMPDIR", "/nonexistent");
  const CliRun refused = run(quick + "--repeat-process 2 --no-history", no_tmp);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("dlprobe: error: --repeat-process: no folder for the processes' "
                                "results (TMPDIR): "),
            std::string::npos)
      << refused.output;
}

// Every open choice takes the fastest the engine knows for the device and says so on stderr; a
// choice given is kept and not announced.
TEST(BenchCliTest, DefaultsPickTheFastestAndSaySo) {
  const std::string quick = kSmall + "--mode infer --steps 1 --min-time 0s --warmup 0 ";
  const CliRun picked = run(quick);
  ASSERT_EQ(picked.exit_code, 0) << picked.output;
  EXPECT_NE(picked.output.find("picked: layout "), std::string::npos) << picked.output;
  EXPECT_NE(picked.output.find("gpu-memory "), std::string::npos) << picked.output;
  EXPECT_NE(
      picked.output.find(
          ", graph off (override with --layout/--gpu-memory/--graph/--streams/--stream-lag)\n"),
      std::string::npos)
      << picked.output;
  const CliRun given = run(quick + "--layout nhwc --gpu-memory planned --graph off");
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_EQ(given.output.find("picked:"), std::string::npos) << given.output;
  // A lag where the open streams come to one (the CPU has one): nothing to bound, the run goes on
  // and says so.
  const CliRun lag = run(quick + "--stream-lag 4");
  EXPECT_EQ(lag.exit_code, 0) << lag.output;
  EXPECT_NE(lag.output.find("dlprobe bench: --stream-lag has no effect on the "), std::string::npos)
      << lag.output;
  EXPECT_NE(given.output.find("step        infer, fp32, nhwc"), std::string::npos) << given.output;
  // The planned arena is one block to the allocator; the text says what it holds.
  EXPECT_NE(given.output.find("\n  in the arena, at its fullest ("), std::string::npos)
      << given.output;
  const CliRun layout_only = run(quick + "--gpu-memory grow --graph off");
  EXPECT_NE(layout_only.output.find("picked: layout "), std::string::npos) << layout_only.output;
  EXPECT_EQ(layout_only.output.find("gpu-memory grow"), std::string::npos) << layout_only.output;
  EXPECT_EQ(layout_only.output.find("in the arena"), std::string::npos) << layout_only.output;
}

// The CUDA backend's options, given for a run on the CPU, are named on stderr (each once); the
// run goes on, and a run without them says nothing of the kind.
TEST(BenchCliTest, CudaOnlyOptionsOnTheCpuAreNamed) {
  const std::string quick = kSmall + "--mode infer --steps 1 --min-time 0s --warmup 0 ";
  const CliRun given = run(quick +
                           "--conv-prologue pass --conv-sums pass --conv-algo heuristic "
                           "--conv-engines any --stem-backward fused");
  ASSERT_EQ(given.exit_code, 0) << given.output;
  for (const char* name :
       {"--conv-prologue", "--conv-sums", "--conv-algo", "--conv-engines", "--stem-backward"}) {
    const std::string line = std::string("dlprobe bench: ") + name + " has no effect on the ";
    const std::size_t at = given.output.find(line);
    EXPECT_NE(at, std::string::npos) << name << "\n" << given.output;
    EXPECT_EQ(given.output.find(line, at + 1), std::string::npos) << name << "\n" << given.output;
  }
  const CliRun plain = run(quick);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("has no effect"), std::string::npos) << plain.output;
}

TEST(BenchCliTest, HelpShowsTheDefaults) {
  const CliRun r = run("--help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* option :
       {"--layout TEXT=auto", "--gpu-memory TEXT=auto", "--graph [auto|on|off]=auto",
        "--backend TEXT=auto", "--precision TEXT=fp32", "--mode TEXT=train", "--device TEXT=auto",
        "--steps INT=30", "--min-time DURATION=2s", "--batch INT[,INT...]|auto=256",
        "--image-size INT=224", "--profile INT ", "--repeat-process INT "}) {
    EXPECT_NE(r.output.find(option), std::string::npos) << option << "\n" << r.output;
  }
}

// Every command's help: a number is typed as one (never TEXT), and a default that is a value is
// shown as CLI11 shows it ("=30"), not in the prose beside it.
TEST(HelpCliTest, NumbersAreTypedAndDefaultsShownOneWay) {
  for (const char* command : {"bench", "memory", "step", "run", "report", "compare", "evaluate",
                              "doctor", "monitor", "pipeline"}) {
    const CliRun r = dlprobe::testing::run_dlprobe({command, "--help"});
    ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      const auto text = line.find("TEXT=");
      if (text != std::string::npos && text + 5 < line.size()) {
        EXPECT_FALSE(std::isdigit(static_cast<unsigned char>(line[text + 5])) != 0)
            << command << ": " << line;
      }
      for (const char* prose : {"(default ", "default:"}) {
        const auto at = line.find(prose);
        if (at == std::string::npos) continue;
        const auto value = line.find_first_not_of(' ', at + std::string_view(prose).size());
        EXPECT_FALSE(value != std::string::npos &&
                     std::isdigit(static_cast<unsigned char>(line[value])) != 0)
            << command << ": " << line;
      }
    }
  }
  // -o is the output everywhere.
  for (const char* command : {"report", "doctor", "evaluate"}) {
    const CliRun r = dlprobe::testing::run_dlprobe({command, "--help"});
    EXPECT_NE(r.output.find("-o,--output"), std::string::npos) << command << "\n" << r.output;
  }
}

// `--version` (and so doctor and every results file, which take the same build information) names
// the commit the sources were at when the binary was built, "-dirty" where tracked files differed:
// read at every build, where a hash taken when CMake configured went stale with each incremental
// build after a commit. Against git's answer in the source tree the binary was built from.
TEST(VersionCliTest, NamesTheCommitTheSourcesAreAt) {
  using dlprobe::testing::run_process;
  const CliRun head =
      run_process({"git", "-C", DLPROBE_SOURCE_DIR, "rev-parse", "--short=12", "HEAD"});
  if (head.exit_code != 0) GTEST_SKIP() << "git, or a git checkout of the sources, is missing";
  const bool dirty =
      run_process({"git", "-C", DLPROBE_SOURCE_DIR, "diff", "--quiet", "HEAD", "--"}).exit_code !=
      0;
  const std::string hash = head.out.substr(0, head.out.find('\n')) + (dirty ? "-dirty" : "");
  const CliRun r = dlprobe::testing::run_dlprobe({"--version"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.out.find("(" + hash + ")"), std::string::npos) << hash << "\n" << r.output;
}

// The default device follows the machine: with no GPU, the CPU backend runs and the output says
// which device was picked and why.
TEST(DoctorCliTest, ANegativeDeviceIsOneLine) {
  const CliRun r =
      dlprobe::testing::run_dlprobe({"doctor", "--no-ceilings", "--device", "-1"}, kOptions);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.err, "dlprobe: error: --device: -1 is not a CUDA device index (0 or more)\n");
  const CliRun twice = dlprobe::testing::run_dlprobe(
      {"doctor", "--no-ceilings", "--dtypes", "fp16,bf16,fp16"}, kOptions);
  EXPECT_EQ(twice.exit_code, 2) << twice.output;
  EXPECT_EQ(twice.err, "dlprobe: error: --dtypes: 'fp16' is given twice\n");
}

TEST(BenchCliTest, NoDeviceGivenRunsWhereTheMachineCan) {
  const CliRun r =
      run("--model resnet18 --width 16 --image-size 32 --classes 10 --batch 2 "
          "--mode infer --steps 1 --min-time 0s --warmup 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  if (r.output.find("dlprobe bench: device cuda:0") != std::string::npos) {
    GTEST_SKIP() << "a GPU is present: the gpu-labelled tests cover it";
  }
  EXPECT_NE(r.output.find("dlprobe bench: device cpu, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" backend; no usable GPU: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("configuration on cpu"), std::string::npos) << r.output;
}

// Processes that keep half the host's CPUs busy while a CPU run is timed: the run says so.
TEST(BenchCliTest, ACompetingProcessIsSeenAndSaid) {
  const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  std::vector<pid_t> spinners;
  for (long i = 0; i < std::max(1L, cpus / 2); ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::atomic<unsigned long> spin{0};
      for (;;) spin.fetch_add(1, std::memory_order_relaxed);
    }
    spinners.push_back(pid);
  }
  const CliRun r = run(kSmall + "--mode infer --steps 3 --min-time 1s --warmup 1 --warmup-time 0s");
  for (const pid_t pid : spinners) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cpu_contention"), std::string::npos) << r.output;
}

TEST(BenchCliTest, CudaWithoutAGpuIsOneLine) {
  const CliRun r = run("--model resnet18 --batch 2 --device cuda:0 --steps 1 --warmup 0");
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is present: the gpu-labelled tests cover it";
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  // What is missing in plain words, and what to run instead; no source path, no runtime jargon.
  EXPECT_NE(r.output.find("dlprobe: error: --device: cuda:0: no usable GPU: "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("run on the CPU instead with --device cpu"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("insufficient"), std::string::npos) << r.output;
}

}  // namespace
