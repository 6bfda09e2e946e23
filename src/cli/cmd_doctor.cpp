// `dlprobe doctor`: the machine, its stack, what works here and the GPU's ceilings.
#include <fmt/format.h>

#include <cstdio>
#include <limits>

#include "commands.h"
#include "dlprobe/core/launcher.h"
#include "dlprobe/core/units.h"
#include "dlprobe/doctor/doctor.h"

namespace dlprobe::cli {

Command add_doctor_command(CLI::App& app) {
  struct Flags {
    bool json = false;
    std::string output;
    bool overwrite = false;
    bool no_ceilings = false;
    int device = 0;
    std::string gemm_size = "8192";
    std::string repetitions = "10";
    std::string dtypes;
    bool nccl = false;
    std::string nccl_max_size = "8GiB";
    std::string nccl_iterations = "20";
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "doctor", "Report the machine, software stack, compatibility, GPU state and ceilings");
  sub->add_flag("--json", flags->json, "Print the report as JSON (schema dlprobe.doctor/1)");
  sub->add_option("-o,--output", flags->output, "Write the report to FILE instead of stdout");
  add_overwrite_flag(*sub, flags->overwrite);
  sub->add_flag("--no-ceilings", flags->no_ceilings,
                "Skip the GEMM and bandwidth measurements (they take tens of seconds)");
  sub->add_option("--device", flags->device, "CUDA device the ceilings are measured on")
      ->capture_default_str()
      ->transform(
          decimal_integer(std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  option(*sub, "--gemm-size", flags->gemm_size, "m = n = k of the GEMM ceilings");
  option(*sub, "--repetitions", flags->repetitions, "Timed repetitions per ceiling (median)");
  sub->add_option("--dtypes", flags->dtypes,
                  "GEMM data types to measure, e.g. bf16,fp8_e4m3 (default: all)");
  sub->add_flag("--nccl", flags->nccl,
                "Measure NCCL all-reduce, all-gather and reduce-scatter from 8 B up across the "
                "visible GPUs (or one rank per process under torchrun, mpirun or srun)");
  option(*sub, "--nccl-max-size", flags->nccl_max_size,
         "Largest NCCL message (lowered where two buffers would not fit in free memory)");
  option(*sub, "--nccl-iterations", flags->nccl_iterations,
         "Timed NCCL calls per size (after 5 warm-up calls)");

  Command command;
  command.app = sub;
  command.run = [flags]() -> int {
    if (Status s = prepare_outputs({{"--output", flags->output}}, flags->overwrite); !s) {
      return report_error(s);
    }
    if (flags->device < 0) {
      return report_error(invalid_argument(
          fmt::format("--device: {} is not a CUDA device index (0 or more)", flags->device)));
    }
    doctor::DoctorOptions options;
    options.ceilings = !flags->no_ceilings;
    options.ceilings_device = flags->device;
    auto size = parse_int(flags->gemm_size, "--gemm-size", 16, 65536);
    if (!size) return report_error(size.status());
    options.ceiling_options.gemm_size = *size;
    auto reps = parse_int(flags->repetitions, "--repetitions", 1, 1000);
    if (!reps) return report_error(reps.status());
    options.ceiling_options.repetitions = static_cast<int>(*reps);
    if (!flags->dtypes.empty()) {
      auto dtypes = parse_each<GemmDtype>(
          flags->dtypes, "--dtypes", [](const std::string& name) -> Result<GemmDtype> {
            const std::optional<GemmDtype> dtype = parse_gemm_dtype(name);
            if (!dtype) {
              return invalid_argument(fmt::format(
                  "--dtypes: unknown data type '{}' (fp32, tf32, fp16, bf16, fp8_e4m3)", name));
            }
            return *dtype;
          });
      if (!dtypes) return report_error(dtypes.status());
      options.ceiling_options.dtypes = std::move(dtypes).value();
    }

    options.collectives = flags->nccl;
    auto max_size = parse_size(flags->nccl_max_size, "--nccl-max-size");
    if (!max_size) return report_error(max_size.status());
    if (*max_size < options.collective_options.bounds.min_bytes)
      return report_error(invalid_argument(
          fmt::format("--nccl-max-size {}: below the smallest message of {} bytes",
                      flags->nccl_max_size, options.collective_options.bounds.min_bytes)));
    options.collective_options.bounds.max_bytes = *max_size;
    auto iterations = parse_int(flags->nccl_iterations, "--nccl-iterations", 1, 10000);
    if (!iterations) return report_error(iterations.status());
    options.collective_options.iterations = static_cast<int>(*iterations);

    auto report = doctor::run_doctor(options);
    if (!report) return report_error(report.status());
    // One rank per process: every rank measures, rank 0 alone reports.
    if (report->collectives && report->collectives->measured) {
      auto rank = read_rank_env(process_env());
      if (rank && rank->rank != 0) return kExitOk;
    }
    const std::string text =
        flags->json ? doctor::render_json(*report) : doctor::render_text(*report);
    if (flags->output.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      return kExitOk;
    }
    if (Status s = write_file_atomic(flags->output, text); !s) return report_error(s);
    return kExitOk;
  };
  return command;
}

}  // namespace dlprobe::cli
