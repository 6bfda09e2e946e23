// dlprobe bench as a user runs it: the binary, its exit code, stdout and stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run(const std::string& args) {
  // Over-large requests must reach the caching allocator's out-of-memory report, not the
  // sanitizer's allocation-size check.
  const std::string command =
      "ASAN_OPTIONS=allocator_may_return_null=1 " DLPROBE_BINARY " bench " + args + " 2>&1";
  CliRun r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr)
    r.output += buf.data();
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

int error_lines(const std::string& out) {
  int n = 0;
  for (std::size_t p = out.find("dlprobe: error:"); p != std::string::npos;
       p = out.find("dlprobe: error:", p + 1))
    ++n;
  return n;
}

void expect_error(const std::string& args, const std::string& needle) {
  const CliRun r = run(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

const std::string kSmall = "--device cpu --model resnet18 --image-size 32 --batch 2 --classes 10 ";

TEST(BenchCliTest, RefusesBadInputWithOneLine) {
  expect_error("--device cpu --model resnet51", "unknown model 'resnet51'");
  expect_error(kSmall + "--precision fp8", "unknown precision 'fp8'");
  expect_error(kSmall + "--mode eval", "unknown mode 'eval'");
  expect_error(kSmall + "--layout chwn", "unknown layout 'chwn'");
  expect_error(kSmall + "--optimizer lamb", "unknown optimizer 'lamb'");
  expect_error("--model resnet18 --device tpu:0", "unknown device 'tpu:0'");
  expect_error(kSmall + "--batch 0", "--batch");
  expect_error(kSmall + "--image-size 0", "--image-size");
  expect_error(kSmall + "--steps 0", "--steps");
  expect_error(kSmall + "--batch two", "--batch");
  // One image of 16x16 leaves layer3's batch norm a single value per channel.
  expect_error("--device cpu --model resnet18 --image-size 16 --batch 1", "cannot take 16x16");
  expect_error(kSmall + "--weights /nonexistent/w.safetensors", "cannot open");
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
  expect_error("--device cpu --model resnet18 --batch 100000000", "cannot allocate");
  const CliRun r = run("--device cpu --model resnet18 --batch 100000000");
  EXPECT_NE(r.output.find("images"), std::string::npos) << r.output;  // the owner
  EXPECT_NE(r.output.find("input"), std::string::npos) << r.output;   // the category
}

TEST(BenchCliTest, CudaWithoutAGpuIsOneLine) {
  const CliRun r = run(kSmall + "--device cuda:0 --steps 1 --warmup 0");
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is present: the gpu-labelled tests cover it";
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(error_lines(r.output), 1) << r.output;
}

}  // namespace
