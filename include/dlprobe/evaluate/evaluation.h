// `dlprobe evaluate` end to end: plan_evaluation runs doctor and picks the machine's sweep (so
// that the caller can say what will run), run_evaluation runs it into results.json, adds the
// findings, writes report.html and sums up in five lines.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dlprobe/bench/sweep.h"
#include "dlprobe/core/files.h"
#include "dlprobe/core/status.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"
#include "dlprobe/doctor/doctor.h"
#include "dlprobe/evaluate/machine_sweep.h"
#include "dlprobe/evaluate/recorded_sweep.h"

namespace dlprobe::evaluate {

struct EvaluateOptions {
  std::filesystem::path folder;          // new, or without results.json
  bool quick = false;                    // a shorter doctor and sweep
  std::optional<device::Device> device;  // nullopt: the first GPU where there is one, else the CPU
  // conv.tuning null: the folder's own tuning.json, which a later run can be given.
  device::ConvOptions conv;
  // Set: every configuration is also trained from these JPEGs (bench --data), so the summary and
  // the findings say whether this machine's input keeps up with its GPU.
  std::optional<bench::JpegInput> data;
};

// "dlprobe-evaluate-<UTC date>-<time>".
std::string default_folder();

// Creates the folder; refuses it, unless `overwrite`, when results.json, report.html or doctor.json
// there holds something (an earlier measurement is not replaced unasked), and when one of them is
// among `inputs`, the files the run reads (core's check_not_inputs).
Status prepare_folder(const std::filesystem::path& folder, bool overwrite,
                      std::span<const NamedOutput> inputs = {});

struct Plan {
  EvaluateOptions options;  // with the tuning cache set
  doctor::Report report;
  MachineSweep chosen;
};

// In a folder prepare_folder accepted: opens the tuning cache, runs doctor with its measured
// ceilings (on the device asked for) into doctor.json, and picks the sweep. `note` hears what is
// about to take a while.
Result<Plan> plan_evaluation(EvaluateOptions options,
                             const std::function<void(const std::string&)>& note);

// doctor's findings as the results record them ("doctor." before each id). Where the sweep runs on
// the CPU by choice (`device_asked` names the CPU) or for want of a GPU (doctor found none), the
// errors about the GPU stack (no driver, a runtime the driver cannot serve, mismatched cuDNN or
// cuBLAS) are information: they stop GPU work, which this evaluation does not do. Asked for a GPU,
// they stay errors.
std::vector<results::Finding> doctor_findings(const doctor::Report& report,
                                              const bench::Sweep& sweep,
                                              const std::optional<device::Device>& device_asked);

struct Evaluation {
  RecordedSweep run;
  std::string summary;  // five lines: machine, ceilings, best, memory, findings and files
  Status status;        // the sweep's, else a file that could not be written
};

// Runs the plan's sweep into results.json (rewritten after every configuration) with GPU telemetry
// (NVML, on a GPU) and doctor's ceilings, records doctor's findings and the sweep's, and writes
// report.html. `command_line` goes into the results' context; `interrupt` counts Ctrl-C.
Result<Evaluation> run_evaluation(const Plan& plan, const std::vector<std::string>& command_line,
                                  const bench::SweepCallbacks& callbacks,
                                  const std::atomic<int>* interrupt);

}  // namespace dlprobe::evaluate
