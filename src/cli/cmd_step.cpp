// dlprobe step: one training step of the native engine from files, into a file, so that another
// framework's step on the same weights and batch can be compared with it tensor by tensor
// (lab/peers/compare_pytorch.py does that against PyTorch); or, with --steps, a training run over
// the batches of the input file, cycled, whose loss curve can be compared the same way.
//
//   --weights W.safetensors  a torchvision state dict (safetensors.torch.save_file(m.state_dict()))
//   --input I.safetensors    `images` [N, 3, H, W] floating, contiguous NCHW; `labels` [N] integer
//   --output O.safetensors   `logits` [N, classes] and `loss` [] and `loss_scale` [] (fp64), then
//                            every parameter's gradient under the parameter's name, NCHW;
//                            with --steps N also `losses` [N] (fp64), one per step
// Batch, image size, classes and width come from the files (`images`, `fc.weight`,
// `conv1.weight`), so nothing a user types can disagree with them.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "commands.h"
#include "dlprobe/core/build_info.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/engine.h"
#include "dlprobe/engine/safetensors.h"
#include "dlprobe/step/step_config.h"
#include "dlprobe/step/training_step.h"
#include "protocol_flags.h"
#include "step_files.h"

namespace dlprobe::cli {
namespace {

// What `dlprobe --help` and `dlprobe step --help` say the command does.
constexpr const char* kStepAbout =
    "Run one native training step from a safetensors state dict and batch; write logits, loss "
    "and every parameter gradient to safetensors (for comparing with another framework)";

struct StepFlags {
  WorkloadFlags workload{.mode = "grads", .layout = "nchw"};
  DeviceFlags where;
  std::string weights;
  std::string input;
  std::string output;
  std::string state_output;
  bool overwrite = false;
  // cuDNN's first choice among exact engines: an agreement check wants the most accurate sums, and
  // the same engines on every run.
  TuningFlags tuning{"heuristic", ""};
  std::string conv_engines = "exact";
  double loss_scale = 0.0;  // read only when given; else GradScaler's initial scale
  bool loss_scale_given = false;
  std::int64_t steps = 1;
  bool write_losses = false;  // --steps given: the `losses` tensor too
  std::int64_t batch = 0;     // read only when given; else every image in one batch
  bool batch_given = false;
  std::vector<std::string> cuda_only;  // options only the CUDA backend reads, given
};

Status run_step_command(const StepFlags& f) {
  engine::StepConfig c;
  DLPROBE_ASSIGN_OR_RETURN(c.model.arch, model::parse_arch(f.workload.model, "--model"));
  DLPROBE_ASSIGN_OR_RETURN(c.precision,
                           for_flag("--precision", engine::parse_precision(f.workload.precision)));
  DLPROBE_ASSIGN_OR_RETURN(c.mode, for_flag("--mode", engine::parse_step_mode(f.workload.mode)));
  DLPROBE_ASSIGN_OR_RETURN(c.layout, parse_layout(f.workload.layout, "--layout"));
  DLPROBE_ASSIGN_OR_RETURN(c.optimizer,
                           workload_optimizer(f.workload, c.mode == engine::StepMode::train));
  DLPROBE_ASSIGN_OR_RETURN(const DeviceChoice where, noted_device_choice(f.where, "step"));
  warn_cuda_only("step", where.backend, f.cuda_only);
  if (const Status s = device::backend_supports(where.backend, c.precision); !s.is_ok()) {
    return s.with_context("--precision");
  }
  // The outputs are written after the step: a path that cannot take them is refused first, before
  // the tuning cache is opened (which creates its file).
  DLPROBE_RETURN_IF_ERROR(prepare_outputs(
      {{"--output", f.output}, {"--state-output", f.state_output}}, f.overwrite,
      {{"--weights", f.weights}, {"--input", f.input}, {"--tuning-cache", f.tuning.cache}}));
  DLPROBE_ASSIGN_OR_RETURN(const Tuning tuning, tuning_options(f.tuning));
  device::ConvOptions conv;
  conv.algo = tuning.algo;
  conv.tuning = tuning.cache;
  DLPROBE_ASSIGN_OR_RETURN(conv.engines,
                           for_flag("--conv-engines", device::parse_conv_engines(f.conv_engines)));
  if (f.loss_scale_given) {
    if (!(f.loss_scale > 0.0) || !std::isfinite(f.loss_scale)) {
      return invalid_argument(
          fmt::format("--loss-scale: {} is not a positive finite number", f.loss_scale));
    }
    if (c.precision != engine::Precision::fp16) {
      return invalid_argument("--loss-scale: only fp16 scales the loss");
    }
    if (c.mode == engine::StepMode::infer) {
      return invalid_argument("--loss-scale: --mode infer has no backward pass to scale");
    }
    c.scaler.init_scale = f.loss_scale;
  }
  // Every file is read, and every problem with one reported, before any memory is taken; the
  // small batch file first.
  DLPROBE_ASSIGN_OR_RETURN(StepInput in, read_step_input(f.input));
  DLPROBE_ASSIGN_OR_RETURN(safetensors::File weights, safetensors::read_file(f.weights));
  DLPROBE_ASSIGN_OR_RETURN(const model::ModelConfig shape, model_of_weights(weights, f.weights));
  c.model.classes = shape.classes;
  c.model.width = shape.width;
  // Every label, not only those of the batches that run (a short run would leave a bad one
  // unseen), numbered as in the file.
  if (Status s = engine::check_label_range(in.labels, shape.classes); !s) {
    return s.with_context(f.input);
  }
  const std::int64_t images = in.images.shape()[0];
  if (f.steps > 1 && c.mode != engine::StepMode::train) {
    return invalid_argument("--steps: more than one step needs --mode train");
  }
  if (f.batch_given && images % f.batch != 0) {
    return invalid_argument(
        fmt::format("--batch: {} does not divide the {} images of {} into whole batches", f.batch,
                    images, f.input));
  }
  c.batch = f.batch_given ? f.batch : images;
  c.model.image_size = in.images.shape()[2];

  DLPROBE_ASSIGN_OR_RETURN(
      std::unique_ptr<device::Engine> e,
      device::Engine::open(where.device, where.backend, conv,
                           c.precision == engine::Precision::fp64 ? DType::fp64 : DType::fp32));
  DLPROBE_ASSIGN_OR_RETURN(std::unique_ptr<engine::TrainingStep> step,
                           engine::TrainingStep::create(c, e->backend(), e->allocator()));
  if (const Status s = step->load_state_dict(weights); !s.is_ok()) {
    return s.with_context(f.weights);
  }
  DLPROBE_RETURN_IF_ERROR(step->keep_logits());
  Result<std::vector<engine::StepResult>> run = step->run_steps(in.images, in.labels, f.steps);
  if (!run.has_value()) return run.status().with_context(f.input);
  const engine::StepResult& r = run->back();

  safetensors::File out;
  const BuildInfo& build = build_info();
  out.metadata = {{"producer", fmt::format("dlprobe {} ({})", build.version, build.git_hash)},
                  {"model", model::model_name(c.model)},
                  {"precision", std::string(engine::precision_name(c.precision))},
                  {"layout", c.layout == Layout::nhwc ? "nhwc" : "nchw"},
                  {"mode", std::string(engine::step_mode_name(c.mode))},
                  {"device", device::device_name(where.device)},
                  {"backend", std::string(e->backend().name())}};
  DLPROBE_ASSIGN_OR_RETURN(HostTensor logits, step->logits());
  out.tensors.push_back(to_file_tensor("logits", logits));
  out.tensors.push_back(scalar_tensor("loss", r.loss));
  out.tensors.push_back(scalar_tensor("loss_scale", r.loss_scale));
  std::size_t skipped = 0;
  if (f.write_losses) {
    HostTensor losses(
        TensorDesc::make(Shape{static_cast<std::int64_t>(run->size())}, DType::fp64).value());
    for (std::size_t i = 0; i < run->size(); ++i) {
      losses.set(static_cast<std::int64_t>(i), (*run)[i].loss);
      skipped += (*run)[i].skipped ? 1 : 0;
    }
    out.tensors.push_back(to_file_tensor("losses", losses));
  }
  std::size_t gradients = 0;
  std::size_t non_finite = 0;
  if (c.mode != engine::StepMode::infer) {
    for (const model::StateEntry& entry : step->model().state()) {
      if (!model::is_parameter(entry.kind)) continue;
      DLPROBE_ASSIGN_OR_RETURN(HostTensor g, step->gradient(entry.name));
      if (first_non_finite(g) >= 0) ++non_finite;
      out.tensors.push_back(to_file_tensor(entry.name, g));
      ++gradients;
    }
  }
  DLPROBE_RETURN_IF_ERROR(safetensors::write_file(f.output, out));
  if (!f.state_output.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(safetensors::File state, step->state_dict());
    DLPROBE_RETURN_IF_ERROR(safetensors::write_file(f.state_output, state));
  }
  std::printf(
      "%s %s %s %s, batch %lld at %lldx%lld, %s backend on %s\n",
      model::model_name(c.model).c_str(), std::string(engine::step_mode_name(c.mode)).c_str(),
      std::string(engine::precision_name(c.precision)).c_str(),
      std::string(layout_name(c.layout)).c_str(), static_cast<long long>(c.batch),
      static_cast<long long>(c.model.image_size), static_cast<long long>(c.model.image_size),
      e->backend().name().data(), device::device_name(where.device).c_str());
  if (f.write_losses) {
    std::printf("%zu steps over %lld batches: loss %.9g first, %.9g last%s\n", run->size(),
                static_cast<long long>(images / c.batch), run->front().loss, r.loss,
                skipped > 0
                    ? fmt::format(" ({} steps skipped: inf/NaN in the gradients)", skipped).c_str()
                    : "");
  }
  std::printf("loss %.9g, loss scale %g%s\n", r.loss, r.loss_scale,
              r.skipped ? " (inf/NaN in the gradients: optimizer step skipped)" : "");
  std::printf("wrote logits, loss%s and %zu gradients to %s\n", f.write_losses ? ", losses" : "",
              gradients, f.output.c_str());
  // Written as computed, but never as if they were an answer: in grads mode fp16's gradients stay
  // scaled, and a scale too large for them overflows (train mode skips such a step and says so).
  if (non_finite > 0 && !r.skipped) {
    std::fputs(
        fmt::format("dlprobe step: {} of the {} gradients hold inf or NaN{}\n", non_finite,
                    gradients,
                    c.precision == engine::Precision::fp16
                        ? fmt::format(" at loss scale {:g}: lower --loss-scale", r.loss_scale)
                        : "")
            .c_str(),
        stderr);
  }
  return Status::ok();
}

}  // namespace

Command add_step_command(CLI::App& app) {
  auto flags = std::make_shared<StepFlags>();
  CLI::App* sub = app.add_subcommand("step", kStepAbout);
  add_model_flag(*sub, flags->workload.model);
  sub->add_option("--weights", flags->weights,
                  "State dict with torchvision names (safetensors.torch.save_file)")
      ->required();
  sub->add_option("--input", flags->input,
                  "Batch: 'images' [N, 3, H, H] floating and 'labels' [N] integer")
      ->required();
  sub->add_option("--output", flags->output,
                  "Where to write 'logits', 'loss', 'loss_scale' and the gradients ('-': "
                  "standard output)")
      ->required();
  sub->add_option("--state-output", flags->state_output,
                  "Also write the state dict after the step (BN running statistics; updated "
                  "weights in train mode)");
  add_overwrite_flag(*sub, flags->overwrite);
  option(*sub, "--precision", flags->workload.precision,
         "fp32, tf32, fp16 (mixed, loss scaled), bf16 (mixed), fp64 (cpu only)");
  option(*sub, "--mode", flags->workload.mode,
         "grads (forward, backward; fp16 gradients stay scaled), train (and the optimizer), infer "
         "(forward with running statistics)");
  option(*sub, "--layout", flags->workload.layout, "nchw or nhwc");
  add_device_flags(*sub, flags->where, "the CPU's only fp16 and fp64");
  option(*sub, "--optimizer", flags->workload.optimizer, "train mode: sgd or adamw");
  add_tuning_flags(*sub, flags->tuning);
  option(*sub, "--conv-engines", flags->conv_engines,
         "Convolution engines allowed: exact (deterministic direct sums, the default: "
         "the most accurate), deterministic, any (also non-deterministic, FFT, Winograd, "
         "reduced-precision reductions)");
  CLI::Option* loss_scale =
      sub->add_option("--loss-scale", flags->loss_scale,
                      "fp16: the loss scale of this step (as GradScaler's initial scale)")
          ->default_str("65536");
  CLI::Option* steps =
      sub->add_option(
             "--steps", flags->steps,
             "Run this many steps (--mode train; step i on batch i mod the input's batches) "
             "and also write their losses as 'losses' [N] (default: one step, no 'losses')")
          ->transform(decimal_integer(1, kMaxSteps));
  CLI::Option* batch =
      sub->add_option("--batch", flags->batch,
                      "Images per step; must divide the input's images (default: all of them)")
          ->transform(decimal_integer(1, std::int64_t{1} << 40));
  return {
      sub, [flags, sub, steps, loss_scale, batch] {
        flags->cuda_only = given_options(*sub, {"--conv-algo", "--conv-engines", "--tuning-cache"});
        flags->write_losses = steps->count() > 0;
        flags->loss_scale_given = loss_scale->count() > 0;
        flags->batch_given = batch->count() > 0;
        flags->workload.optimizer_given = sub->count("--optimizer") > 0;
        const Status s = run_step_command(*flags);
        return s.is_ok() ? kExitOk : report_error(s);
      }};
}

}  // namespace dlprobe::cli
