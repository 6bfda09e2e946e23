// dlprobe memory as a user runs it: the binary, its exit code, output and results file.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "analysis_test_util.h"
#include "common/run_dlprobe.h"
#include "dlprobe/core/build_info.h"
#include "dlprobe/memory/prediction.h"
#include "dlprobe/results/results.h"

namespace dlprobe::memory {
namespace {

using CliRun = dlprobe::testing::ProcessResult;

CliRun run(const std::string& command_tail) {
  return dlprobe::testing::run_dlprobe(dlprobe::testing::split_args(command_tail));
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kSmall =
    "memory --model resnet18 --width 16 --image-size 32 --classes 10 --device cpu "
    "--backend reference --calibration-batch 2 ";
// The same model predicted: --predict-only takes no option only a measurement reads.
const std::string kPredict = "memory --model resnet18 --width 16 --image-size 32 --classes 10 ";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("dlprobe_memory_{}_{}", getpid(), name))
      .string();
}

TEST(MemoryCli, RefusesBadInputWithOneLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"--gpu-memory lots", "--gpu-memory: 'lots' has an unknown mode"},
      {"--gpu-memory grow,limit:0", "--gpu-memory"},
      {"--batch 0", "--batch: 0 is out of range"},
      {"--batch 2,x", "--batch"},
      {"--batch 8,8", "--batch: '8' is given twice"},
      {"--batch 32,032", "--batch: '32' and '032' are the same"},
      {"--warmup 010x", "--warmup: '010x' is not a whole number"},
      {"--precision fp32,fp32", "--precision: 'fp32' is given twice"},
      {"--gpu-memory grow,grow", "--gpu-memory: 'grow' is given twice"},
      {"--gpu-memory prealloc:0.5,prealloc:50%",
       "--gpu-memory: 'prealloc:0.5' and 'prealloc:50%' are the same"},
      {"memory --predict-only --model resnet18 --layout nchw --gpu-memory grow --image-size 65536 "
       "--batch 1099511627776",
       "overflows 64 bits"},
      {"--precision fp8", "unknown precision 'fp8'"},
      {"--warmup -1", "--warmup"},
      {"--max-batch", "--max-batch: give --limit"},
      {"--limit 1GiB", "--limit: only with --max-batch"},
      {"--device-memory 16GiB", "--device-memory: describes a GPU you do not have"},
      {"--max-batch --limit 1GiB --gpu-memory prealloc", "use grow or planned"},
      {"memory --predict-only --max-batch", "give --device-memory"},
      {"--predict-only",
       "--predict-only measures nothing: leave out --device, --backend, --calibration-batch (only "
       "a measurement reads them)"},
      {"memory --predict-only --max-batch --limit 16GiB --device-memory 8GiB",
       "--limit: 16.0 GiB is more than the --device-memory 8.00 GiB"},
      {"memory --mode grads --optimizer adamw",
       "--optimizer: only with --mode train (the optimizer's update)"},
      {"--max-batch --limit 100TiB", "--limit: 100 TiB is more than the "},
      {"--calibration /nonexistent/results.json", "/nonexistent/results.json"},
      {"--conv-algo fastest", "--conv-algo"},
      {"--tuning-cache /nonexistent/dir/t.json", "--tuning-cache"},
      {"memory --device tpu", "unknown device 'tpu'"},
      {"memory --device cpu --backend tpu", "--backend: unknown backend 'tpu'"},
      {"memory --device cpu --backend cuda", "--backend: backend cuda does not run on cpu"},
      {"--conv-engines fft", "--conv-engines: unknown choice 'fft'"},
      {"--recompute all", "--recompute: unknown choice 'all' (expected none or block-outputs)"},
      {"memory --model resnet51", "unknown model 'resnet51'"},
      {"memory --model resnet18 --device cpu --calibration-batch 0",
       "--calibration-batch: 0 is out of range (accepts 1 to 1099511627776)"},
      {"--json ''", "--json: an empty value"},
  };
  for (const auto& [args, needle] : cases) {
    const CliRun r = run(args.starts_with("memory ") ? args : kSmall + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(has(r.output, "dlprobe: error: ")) << args << "\n" << r.output;
    EXPECT_TRUE(has(r.output, needle)) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
}

TEST(MemoryCli, PredictsWithoutADevice) {
  const CliRun r = run(kPredict +
                       "--predict-only --batch 4 --gpu-memory grow,planned "
                       "--device-memory 256MiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part :
       {"resnet18-w16 bs4 fp32 train NCHW sgd, --gpu-memory grow, predicted", "peak ",
        "activations", "weights", "reserved", "waste", "fragmentation", "without a calibration",
        "--gpu-memory planned", "arena ", "fits        yes in 256 MiB",
        "largest batch predicted to fit 256 MiB"}) {
    EXPECT_TRUE(has(r.output, part)) << part << "\n" << r.output;
  }
}

// The figure after `label` in a printed breakdown, in bytes ("    activations   151 KiB").
double bytes_after(const std::string& output, const std::string& label) {
  const std::size_t at = output.find(label);
  if (at == std::string::npos) return -1;
  std::istringstream line(output.substr(at + label.size()));
  double value = -1;
  std::string unit;
  line >> value >> unit;
  const double scale = unit == "GiB"   ? 1024.0 * 1024 * 1024
                       : unit == "MiB" ? 1024.0 * 1024
                       : unit == "KiB" ? 1024.0
                                       : 1.0;
  return value * scale;
}

// Without a device the prediction plans the step the same --conv-engines would run: with any,
// batch norm inside the convolutions (fp16 NHWC), so block 1's normalised tensors (16 MB each
// here) are not kept: the convolutions apply them. The CUDA backend's default keeps those of at
// most 13 MB.
TEST(MemoryCli, PredictionFollowsTheConvolutionEnginesFusion) {
  const std::string tail =
      "memory --model resnet18 --width 16 --image-size 224 --classes 10 --precision fp16 "
      "--layout nhwc --batch 160 --mode grads --predict-only";
  const CliRun fused = run(tail + " --conv-engines any");
  const CliRun apart = run(tail);
  ASSERT_EQ(fused.exit_code, 0) << fused.output;
  ASSERT_EQ(apart.exit_code, 0) << apart.output;
  const double a = bytes_after(fused.output, "    activations");
  const double b = bytes_after(apart.output, "    activations");
  ASSERT_GT(a, 0) << fused.output;
  EXPECT_LT(a, b) << fused.output << "\n" << apart.output;
}

// bf16 and tf32 run batch norm inside the convolutions too, with dlprobe's sums pass, so that
// recomputing the block outputs lowers their predicted peak as in fp16; and they keep every
// normalised tensor, where fp16 keeps only those of at most 13 MB (layer4's at batch 256): bf16
// holds about 1.5 GiB more activations than fp16.
TEST(MemoryCli, Bf16AndTf32PlanBatchNormInsideTheConvolutionsAndKeepTheNormalisedTensors) {
  const std::string tail =
      "memory --model resnet50 --batch 256 --mode grads --predict-only --conv-engines any "
      "--precision ";
  const auto figure = [&](const std::string& args, const std::string& label) {
    const CliRun r = run(tail + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const double bytes = bytes_after(r.output, label);
    EXPECT_GT(bytes, 0) << r.output;
    return bytes;
  };
  for (const std::string precision : {"bf16", "tf32"}) {
    EXPECT_LT(figure(precision + " --recompute block-outputs", "peak "),
              0.75 * figure(precision, "peak "))
        << precision;
  }
  EXPECT_GT(figure("bf16", "    activations"),
            figure("fp16", "    activations") + 1.2 * 1024 * 1024 * 1024);
}

// ResNet-50 at batch 256 in fp16 (batch norm inside the convolutions): recomputing the block
// outputs takes the predicted peak from 8.59 to 6.21 GiB.
TEST(MemoryCli, RecomputedBlockOutputsLowerThePredictedPeak) {
  const std::string tail =
      "memory --model resnet50 --precision fp16 --batch 256 --mode grads --predict-only "
      "--conv-engines any";
  const CliRun kept = run(tail);
  const CliRun again = run(tail + " --recompute block-outputs");
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const double a = bytes_after(again.output, "peak ");
  const double b = bytes_after(kept.output, "peak ");
  ASSERT_GT(a, 0) << again.output;
  EXPECT_LT(a, 0.75 * b) << again.output << "\n" << kept.output;
}

// The largest batch says what recomputing the block outputs would fit, where the step can and
// does not already: fp16 with batch norm inside the convolutions, not fp32.
TEST(MemoryCli, MaxBatchSaysWhatRecomputingWouldFit) {
  const std::string tail =
      "memory --model resnet50 --width 16 --image-size 64 --max-batch --predict-only "
      "--device-memory 1GiB --conv-engines any --precision ";
  const std::string hint = "recompute   with --recompute block-outputs, batch ";
  const CliRun fp16 = run(tail + "fp16");
  ASSERT_EQ(fp16.exit_code, 0) << fp16.output;
  EXPECT_TRUE(has(fp16.output, hint)) << fp16.output;
  const CliRun again = run(tail + "fp16 --recompute block-outputs");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_FALSE(has(again.output, hint)) << again.output;
  // The batch the hint names is the one the recomputing step is predicted to fit.
  const std::size_t at = fp16.output.find(hint) + hint.size();
  const std::string batch = fp16.output.substr(at, fp16.output.find(' ', at) - at);
  EXPECT_TRUE(has(again.output, "1.00 GiB: " + batch + " (")) << batch << "\n" << again.output;
  const CliRun fp32 = run(tail + "fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_FALSE(has(fp32.output, hint)) << fp32.output;
}

TEST(MemoryCli, PicksTheFastestSettingsAndSaysSo) {
  // Nothing named: each precision's fastest layout and the plan for the GPU predicted for.
  const CliRun r = run(kPredict + "--predict-only --batch 4 --precision fp32,fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part :
       {"picked: layout nchw for fp32 and nhwc for fp16, gpu-memory planned (override with "
        "--layout/--gpu-memory)",
        "bs4 fp32 train NCHW sgd, --gpu-memory planned",
        "bs4 fp16 train NHWC sgd, --gpu-memory planned"}) {
    EXPECT_TRUE(has(r.output, part)) << part << "\n" << r.output;
  }
  // Measured on the CPU: NHWC over a growing allocator; what is named is not picked.
  const CliRun cpu = run(kSmall + "--batch 2");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_TRUE(has(cpu.output, "picked: layout nhwc, gpu-memory grow")) << cpu.output;
  const CliRun named = run(kSmall + "--batch 2 --layout nchw --gpu-memory planned");
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_FALSE(has(named.output, "picked")) << named.output;
  EXPECT_TRUE(has(named.output, "NCHW sgd, --gpu-memory planned")) << named.output;
}

// --device cpu means what it means to bench: the oneDNN backend where built, the reference loops
// only when named; with no --device, the first usable GPU, else the CPU, said on stderr.
TEST(MemoryCli, TheCpuIsTheCpuBackendAsInBench) {
  const std::string small =
      "memory --model resnet18 --width 16 --image-size 32 --classes 10 "
      "--calibration-batch 2 --batch 2 ";
  const char* backend = build_info().with_onednn ? "cpu (oneDNN)" : "cpu (reference)";
  const CliRun cpu = run(small + "--device cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_TRUE(has(cpu.output, backend)) << cpu.output;
  EXPECT_FALSE(has(cpu.output, "has no effect")) << cpu.output;
  // The engines' choice is the CUDA backend's: given for the CPU, it is named.
  const CliRun algo = run(small + "--device cpu --conv-algo heuristic");
  ASSERT_EQ(algo.exit_code, 0) << algo.output;
  EXPECT_TRUE(has(algo.output, "dlprobe memory: --conv-algo has no effect on the ")) << algo.output;
  const CliRun picked = run(small);
  ASSERT_EQ(picked.exit_code, 0) << picked.output;
  if (has(picked.output, "dlprobe memory: device cuda:0")) GTEST_SKIP() << "a GPU is present";
  EXPECT_TRUE(has(picked.output, "dlprobe memory: device cpu, ")) << picked.output;
  EXPECT_TRUE(has(picked.output, backend)) << picked.output;
}

// Ctrl-C: the configuration being measured finishes, the rest are skipped, and what was measured
// stays in --json and reaches the history (it had been killed mid-table, the history left out).
TEST(MemoryCli, InterruptedKeepsWhatWasMeasured) {
  const std::string dir = ::testing::TempDir() + "memory_cli_interrupt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string batches = "8";
  for (int b = 16; b <= 320; b += 8) batches += fmt::format(",{}", b);
  dlprobe::testing::ProcessOptions options;
  options.interrupt_after = std::chrono::milliseconds(1500);
  const CliRun r = dlprobe::testing::run_dlprobe(
      dlprobe::testing::split_args(
          "memory --model resnet18 --width 16 --image-size 96 --classes 10 --device cpu "
          "--backend reference --batch " +
          batches + " --json " + dir + "/m.json --history " + dir + "/h.sqlite"),
      options);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "dlprobe memory: interrupted; what was measured is in the results"))
      << r.output;
  auto doc = results::read_file(dir + "/m.json");
  ASSERT_TRUE(doc) << doc.status().message();
  EXPECT_GE(doc->configurations.size(), 1u);
  EXPECT_LT(doc->configurations.size(), 40u);
  const CliRun listed = run("history --history " + dir + "/h.sqlite list");
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_TRUE(has(listed.output, "resnet18")) << listed.output;
  std::filesystem::remove_all(dir);
}

TEST(MemoryCli, MeasuresBesideThePredictionAndWritesResults) {
  const std::string json = temp_path("measured.json");
  const CliRun r = run(kSmall + "--batch 2,4 --gpu-memory grow,planned --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"the calibration run", "predicted", "prediction error", "+0.0 %",
                           "(calibration)", "cpu (reference)"}) {
    EXPECT_TRUE(has(r.output, part)) << part << "\n" << r.output;
  }
  Result<results::Document> d = results::read_file(json);
  ASSERT_TRUE(d.has_value()) << d.status().message();
  ASSERT_EQ(d->configurations.size(), 4u);
  for (const results::Configuration& c : d->configurations) {
    ASSERT_TRUE(c.memory.has_value());
    EXPECT_EQ(c.memory->source, "allocator");
    EXPECT_TRUE(c.memory->allocator_stats.is_object());
    const auto& a = c.memory->analysis;
    ASSERT_TRUE(a.is_object());
    EXPECT_TRUE(a["measured"]["timeline"].is_object());
    EXPECT_EQ(a["measured"]["peak"]["allocated_bytes"], a["predicted"]["peak"]["allocated_bytes"]);
    EXPECT_EQ(a["calibration"]["batch"], c.settings.batch);  // what this run measured
    EXPECT_EQ(a["prediction_calibration"]["batch"], 2);      // what its prediction used
    EXPECT_EQ(a["memory_plan"], c.settings.gpu_memory == "planned" ? "planned" : "dynamic");
  }
  // Its calibration feeds a prediction elsewhere; the report draws its timelines.
  const CliRun p = run(kPredict + "--predict-only --batch 8 --calibration " + json);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(has(p.output, "(calibration: cpu (reference) bs2)")) << p.output;
  const CliRun other =
      run(kPredict + "--predict-only --batch 8 --precision fp16 --calibration " + json);
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_TRUE(has(other.output, "--calibration has no run of resnet18-w16 fp16")) << other.output;
  // The results may not replace the calibration they are predicted from.
  const CliRun same = run(kPredict + "--predict-only --batch 8 --calibration " + json + " --json " +
                          json + " --overwrite");
  EXPECT_EQ(same.exit_code, 2) << same.output;
  EXPECT_TRUE(has(same.output, "--calibration and --json both name " + json)) << same.output;
  const std::string html = temp_path("report.html");
  const CliRun rep = run("report " + json + " -o " + html);
  ASSERT_EQ(rep.exit_code, 0) << rep.output;
  std::ifstream in(html);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(has(page, "chart-memory-timeline-3"));
  std::filesystem::remove(json);
  std::filesystem::remove(html);
}

// A memory run and a bench run on one machine record the same stack (the CUDA runtime and the
// libraries doctor probes), so that the report and the history do not take them for two machines.
TEST(MemoryCli, RecordsTheStackAsBenchDoes) {
  const std::string memory_json = temp_path("stack_memory.json");
  const std::string bench_json = temp_path("stack_bench.json");
  const CliRun m = run(kSmall + "--batch 2 --json " + memory_json + " --overwrite");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  const CliRun b =
      run("bench --model resnet18 --width 16 --image-size 32 --classes 10 --device cpu --backend "
          "reference --batch 2 --steps 2 --warmup 1 --no-ceiling --json " +
          bench_json + " --overwrite");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  Result<results::Document> from_memory = results::read_file(memory_json);
  Result<results::Document> from_bench = results::read_file(bench_json);
  ASSERT_TRUE(from_memory && from_bench);
  EXPECT_FALSE(from_memory->context.libraries.empty());
  EXPECT_EQ(from_memory->context.libraries, from_bench->context.libraries);
  EXPECT_EQ(from_memory->context.cuda_runtime_version, from_bench->context.cuda_runtime_version);
  std::filesystem::remove(memory_json);
  std::filesystem::remove(bench_json);
}

// The history keeps what was measured: a prediction is not added, a measurement is.
TEST(MemoryCli, OnlyMeasurementsEnterTheHistory) {
  const std::string history = temp_path("history.sqlite");
  std::filesystem::remove(history);
  const CliRun p = run(kPredict + "--predict-only --batch 4 --history " + history);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_FALSE(std::filesystem::exists(history));
  const CliRun m = run(kSmall + "--batch 2 --history " + history);
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_TRUE(std::filesystem::exists(history));
  std::filesystem::remove(history);
}

TEST(MemoryCli, TellsWhatThePlannedArenaHolds) {
  const CliRun r = run(kSmall + "--batch 2 --layout nchw --gpu-memory planned");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The arena's block, then its parts beneath it, before the total.
  const std::size_t arena = r.output.find("\n  arena ");
  const std::size_t activations = r.output.find("\n    activations ", arena);
  const std::size_t gradients = r.output.find("\n    backward gradients ", arena);
  const std::size_t free = r.output.find("\n    free ", arena);
  const std::size_t total = r.output.find("\n  = allocated ", arena);
  ASSERT_NE(arena, std::string::npos) << r.output;
  EXPECT_LT(activations, free) << r.output;
  EXPECT_LT(gradients, free) << r.output;
  EXPECT_LT(free, total) << r.output;
  EXPECT_NE(total, std::string::npos) << r.output;
  for (const char* part : {"of it free, the largest free piece",
                           "fullest     the arena holds the most live bytes at the peak's call"}) {
    EXPECT_TRUE(has(r.output, part)) << part << "\n" << r.output;
  }
  EXPECT_FALSE(has(r.output, "unused here")) << r.output;
}

TEST(MemoryCli, FindsTheLargestBatchUnderALimitAndVerifiesIt) {
  SimulationOptions at5;
  at5.step = testing::small_config(5);
  Result<StepMemory> five = simulate_step(at5);
  ASSERT_TRUE(five.has_value());
  const auto limit = static_cast<std::uint64_t>(five->reserved_peak_bytes) + (1u << 20);
  const CliRun r = run(kSmall + fmt::format("--max-batch --limit {}", limit));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"== max batch under", "predicted   ", "fits: peak", "does not fit: ",
                           "cannot allocate", "(measured: it runs a full training step, "}) {
    EXPECT_TRUE(has(r.output, part)) << part << "\n" << r.output;
  }
}

}  // namespace
}  // namespace dlprobe::memory
