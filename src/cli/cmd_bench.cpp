// dlprobe bench: throughput and peak memory of a native ResNet training step.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "dlprobe/bench.h"
#include "dlprobe/units.h"

namespace dlprobe::cli {
namespace {

struct BenchFlags {
  std::string model = "resnet50";
  std::int64_t batch = 256;
  std::string precision = "fp32";
  std::string mode = "train";
  std::string layout = "nchw";
  std::int64_t steps = 30;
  std::int64_t warmup = 5;
  std::string device = "cuda:0";
  std::int64_t image_size = 224;
  std::int64_t classes = 1000;
  std::string optimizer = "sgd";
  std::string weights;
  std::string conv_algo = "autotune";
  std::string conv_engines = "any";
  std::int64_t profile = 0;
};

Result<bench::BenchOptions> to_options(const BenchFlags& f) {
  bench::BenchOptions o;
  DLPROBE_ASSIGN_OR_RETURN(o.step.model.arch, model::parse_arch(f.model, "--model"));
  DLPROBE_ASSIGN_OR_RETURN(o.step.precision, engine::parse_precision(f.precision, "--precision"));
  DLPROBE_ASSIGN_OR_RETURN(o.step.mode, engine::parse_step_mode(f.mode, "--mode"));
  DLPROBE_ASSIGN_OR_RETURN(o.step.layout, parse_layout(f.layout, "--layout"));
  DLPROBE_ASSIGN_OR_RETURN(o.step.optimizer, engine::parse_optimizer(f.optimizer, "--optimizer"));
  DLPROBE_ASSIGN_OR_RETURN(o.device, bench::parse_device(f.device, "--device"));
  if (f.batch < 1) return invalid_argument(fmt::format("--batch: must be >= 1, got {}", f.batch));
  if (f.image_size < 1) {
    return invalid_argument(fmt::format("--image-size: must be >= 1, got {}", f.image_size));
  }
  if (f.classes < 1) {
    return invalid_argument(fmt::format("--classes: must be >= 1, got {}", f.classes));
  }
  if (f.steps < 1) return invalid_argument(fmt::format("--steps: must be >= 1, got {}", f.steps));
  if (f.warmup < 0) {
    return invalid_argument(fmt::format("--warmup: must be >= 0, got {}", f.warmup));
  }
  o.step.batch = f.batch;
  o.step.model.image_size = f.image_size;
  o.step.model.classes = f.classes;
  o.steps = f.steps;
  o.warmup = f.warmup;
  o.weights = f.weights;
  if (f.conv_algo != "autotune" && f.conv_algo != "heuristic") {
    return invalid_argument(fmt::format(
        "--conv-algo: unknown choice '{}' (expected autotune or heuristic)", f.conv_algo));
  }
  o.conv.autotune = f.conv_algo == "autotune";
  DLPROBE_ASSIGN_OR_RETURN(o.conv.engines,
                           bench::parse_conv_engines(f.conv_engines, "--conv-engines"));
  if (f.profile < 0) {
    return invalid_argument(fmt::format("--profile: must be >= 0, got {}", f.profile));
  }
  o.profile_steps = f.profile;
  return o;
}

// Device time per kind of call, then the slowest calls.
void print_profile(const std::vector<bench::CallTime>& profile) {
  std::map<std::string_view, std::pair<double, int>> by_kind;
  double total = 0;
  for (const bench::CallTime& t : profile) {
    auto& [ms, count] = by_kind[engine::call_kind_name(t.kind)];
    ms += t.ms;
    ++count;
    total += t.ms;
  }
  std::vector<std::pair<std::string_view, std::pair<double, int>>> kinds(by_kind.begin(),
                                                                         by_kind.end());
  std::sort(kinds.begin(), kinds.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::printf("profile     %.3f ms per step (median per call), by kind:\n", total);
  for (const auto& [kind, v] : kinds) {
    std::printf("  %-28s %9.3f ms %5.1f %%  %4d calls\n", std::string(kind).c_str(), v.first,
                100.0 * v.first / std::max(total, 1e-12), v.second);
  }
  std::vector<const bench::CallTime*> slowest;
  for (const bench::CallTime& t : profile) slowest.push_back(&t);
  std::sort(slowest.begin(), slowest.end(),
            [](const bench::CallTime* a, const bench::CallTime* b) { return a->ms > b->ms; });
  slowest.resize(std::min<std::size_t>(slowest.size(), 25));
  std::printf("  slowest calls:\n");
  for (const bench::CallTime* t : slowest) {
    std::printf("  %9.3f ms  %s\n", t->ms, t->name.c_str());
  }
}

void print(const bench::BenchOptions& o, const bench::BenchResult& r) {
  const engine::StepConfig& c = o.step;
  std::printf("model       %s, %lldx%lld images, %lld classes, batch %lld\n",
              std::string(model::arch_name(c.model.arch)).c_str(),
              static_cast<long long>(c.model.image_size),
              static_cast<long long>(c.model.image_size), static_cast<long long>(c.model.classes),
              static_cast<long long>(c.batch));
  std::printf("step        %s, %s, %s, %s\n", std::string(engine::step_mode_name(c.mode)).c_str(),
              std::string(engine::precision_name(c.precision)).c_str(),
              std::string(layout_name(c.layout)).c_str(),
              c.mode == engine::StepMode::train
                  ? std::string(engine::optimizer_name(c.optimizer)).c_str()
                  : "no optimizer");
  std::printf("device      %s, %s backend%s\n", bench::device_name(o.device).c_str(),
              r.backend.c_str(),
              o.device.kind == DeviceKind::cpu ? " (plain loops for correctness, not speed)" : "");
  std::printf("timed       %lld steps after %lld warm-up, %.3f s\n",
              static_cast<long long>(o.steps), static_cast<long long>(o.warmup), r.elapsed_seconds);
  std::printf("throughput  %.2f img/s\n", r.images_per_second);
  std::printf("loss        %.4f (last step%s)\n", r.last.loss,
              c.precision == engine::Precision::fp16
                  ? fmt::format(", loss scale {}", r.last.loss_scale).c_str()
                  : "");
  const memory::MemoryStats& m = r.memory;
  std::printf("peak memory %s allocated, %s reserved\n",
              format_size(static_cast<std::uint64_t>(m.all.allocated_bytes_peak)).c_str(),
              format_size(static_cast<std::uint64_t>(m.reserved_bytes_peak)).c_str());
  for (const memory::Category cat : memory::kAllCategories) {
    std::printf("  %-16s %s peak, %s at the overall peak\n",
                std::string(memory::category_name(cat)).c_str(),
                format_size(static_cast<std::uint64_t>(m[cat].allocated_bytes_peak)).c_str(),
                format_size(static_cast<std::uint64_t>(
                                m.peak.allocated_by_category[static_cast<std::size_t>(cat)]))
                    .c_str());
  }
  if (!m.peak.owner.empty()) std::printf("  peak set by      %s\n", m.peak.owner.c_str());
  if (!r.profile.empty()) print_profile(r.profile);
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Time a native ResNet training step: img/s and peak memory by category. --device cpu runs "
      "the slow reference backend (a correctness tool, not a CPU benchmark)");
  sub->add_option("--model", flags->model, "resnet18, resnet34, resnet50, resnet101, resnet152")
      ->capture_default_str();
  sub->add_option("--batch", flags->batch, "Images per step")->capture_default_str();
  sub->add_option("--precision", flags->precision,
                  "fp32, tf32, fp16 (mixed, loss scaling), bf16 (mixed), fp64 (cpu only)")
      ->capture_default_str();
  sub->add_option("--mode", flags->mode,
                  "train (forward, backward, optimizer), grads (forward, backward), infer")
      ->capture_default_str();
  sub->add_option("--layout", flags->layout, "nchw or nhwc")->capture_default_str();
  sub->add_option("--steps", flags->steps, "Timed steps")->capture_default_str();
  sub->add_option("--warmup", flags->warmup, "Untimed steps first")->capture_default_str();
  sub->add_option("--device", flags->device, "cpu or cuda:N")->capture_default_str();
  sub->add_option("--image-size", flags->image_size, "Square image side")->capture_default_str();
  sub->add_option("--classes", flags->classes, "Output classes")->capture_default_str();
  sub->add_option("--optimizer", flags->optimizer, "sgd (momentum 0.9, wd 1e-4, lr 0.1) or adamw")
      ->capture_default_str();
  sub->add_option("--weights", flags->weights,
                  "Start from a safetensors state dict (torchvision names)");
  sub->add_option("--conv-algo", flags->conv_algo,
                  "cuDNN engine per convolution shape: autotune (time each, keep the fastest, as "
                  "cudnn.benchmark) or heuristic (cuDNN's first choice)")
      ->capture_default_str();
  sub->add_option("--conv-engines", flags->conv_engines,
                  "Which cuDNN engines may compete: any (as cudnn.benchmark: also "
                  "non-deterministic, FFT and Winograd), deterministic, exact (deterministic "
                  "direct sums)")
      ->capture_default_str();
  sub->add_option("--profile", flags->profile,
                  "After timing, N more steps with a mark around every call: device time per "
                  "kind of call and the slowest calls");
  return {sub, [flags] {
            Result<bench::BenchOptions> options = to_options(*flags);
            if (!options.has_value()) return report_error(options.status());
            std::fprintf(stderr, "dlprobe bench: planning and warming up...\n");
            Result<bench::BenchResult> result = bench::run_bench(*options);
            if (!result.has_value()) return report_error(result.status());
            print(*options, *result);
            return kExitOk;
          }};
}

}  // namespace dlprobe::cli
