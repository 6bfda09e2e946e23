// Results documents for the history's tests: a run on a named machine and date whose steps take
// about `step_s` seconds each (with a little deterministic jitter), 64 images per step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/results/results.h"
#include "dlprobe/stats/statistics.h"

namespace dlprobe::history::testing {

struct RunSpec {
  std::string machine = "node1";
  std::string date = "2026-03-01T12:00:00Z";
  std::string driver = "580.65.06";
  std::string model = "resnet50";
  std::string precision = "bf16";
  std::int64_t batch = 64;
  double step_s = 0.1;
  int steps = 40;
  std::optional<double> energy_j;
  std::optional<results::Container> container;

  // Chained changes: RunSpec().on("alpha").at("2026-03-02T12:00:00Z").
  RunSpec on(std::string v) const { return with(&RunSpec::machine, std::move(v)); }
  RunSpec at(std::string v) const { return with(&RunSpec::date, std::move(v)); }
  RunSpec driven_by(std::string v) const { return with(&RunSpec::driver, std::move(v)); }
  RunSpec in(std::string v) const { return with(&RunSpec::precision, std::move(v)); }
  RunSpec batch_of(std::int64_t v) const { return with(&RunSpec::batch, v); }
  RunSpec stepping(double v) const { return with(&RunSpec::step_s, v); }
  RunSpec timing(int v) const { return with(&RunSpec::steps, v); }
  RunSpec using_energy(double v) const {
    return with(&RunSpec::energy_j, std::optional<double>(v));
  }
  RunSpec inside(results::Container v) const {
    return with(&RunSpec::container, std::optional<results::Container>(std::move(v)));
  }

 private:
  template <class T>
  RunSpec with(T RunSpec::*field, T value) const {
    RunSpec r = *this;
    r.*field = std::move(value);
    return r;
  }
};

inline results::Configuration configuration(const RunSpec& r) {
  results::Configuration c;
  c.settings.model = r.model;
  c.settings.batch = r.batch;
  c.settings.precision = r.precision;
  c.settings.mode = "train";
  c.settings.layout = "nhwc";
  c.settings.device = "cuda:0";
  c.settings.optimizer = "sgd";
  for (int i = 0; i < r.steps; ++i) {
    // +-1% around step_s, the same pattern in every run.
    c.samples.step_seconds.push_back(r.step_s * (1 + 0.01 * ((i * 7) % 5 - 2) / 2.0));
    c.samples.step_items.push_back(static_cast<double>(r.batch));
  }
  c.statistics = stats::summarize(c.samples.step_seconds, c.samples.step_items).value();
  if (r.energy_j) {
    results::Telemetry t;
    t.energy_j = r.energy_j;
    t.energy_source = "counter";
    c.telemetry.push_back(t);
  }
  return c;
}

inline results::Context context(const RunSpec& r) {
  results::Context c;
  c.dlprobe_version = "0.1.0";
  c.git_hash = "abc";
  c.command_line = {"dlprobe", "bench"};
  c.date = r.date;
  c.hostname = r.machine;
  c.os = "Linux";
  c.cpu = "cpu";
  c.driver_version = r.driver;
  c.cuda_runtime_version = "13.0";
  c.libraries = {{"cuDNN", "9.19.0", ""}, {"cuBLAS", "13.0.0", ""}};
  results::Gpu g;
  g.name = "NVIDIA H200";
  c.gpus.push_back(g);
  c.container = r.container;
  return c;
}

inline results::Document document(const RunSpec& r) {
  results::Document d;
  d.context = context(r);
  d.configurations.push_back(configuration(r));
  return d;
}

}  // namespace dlprobe::history::testing
