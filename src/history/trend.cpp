#include "dlprobe/history/trend.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <thread>
#include <tuple>

#include "dlprobe/core/files.h"

namespace dlprobe::history {

std::optional<Cost> cost_at(std::optional<double> throughput, double price_per_gpu_hour) {
  if (!throughput || !(*throughput > 0) || !std::isfinite(*throughput) ||
      !(price_per_gpu_hour > 0) || !std::isfinite(price_per_gpu_hour)) {
    return std::nullopt;
  }
  const double dollars_per_image = price_per_gpu_hour / 3600.0 / *throughput;
  return Cost{dollars_per_image * 1e6, dollars_per_image * kImageNetEpochImages};
}

std::optional<double> Prices::of(const std::string& gpu) const {
  if (flat) return flat;
  if (auto it = per_gpu.find(gpu); it != per_gpu.end()) return it->second;
  return fallback;
}

Result<std::filesystem::path> default_config_path() {
  return xdg_file("XDG_CONFIG_HOME", ".config", "config.json", "config", "--config FILE");
}

Result<Prices> read_prices(const std::filesystem::path& config) {
  std::error_code ec;
  if (!std::filesystem::exists(config, ec)) return Prices{};
  const std::string name = config.string();
  std::ifstream in(config, std::ios::binary);
  if (!in || std::filesystem::is_directory(config, ec)) {
    return error(Errc::io_error, fmt::format("config {}: cannot read it", name));
  }
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) {
    return invalid_argument(fmt::format("config {}: not JSON", name));
  }
  if (!j.is_object()) {
    return invalid_argument(fmt::format("config {}: (top level): expected an object", name));
  }
  const auto table = j.find("price_per_gpu_hour");
  if (table == j.end()) return Prices{};
  if (!table->is_object()) {
    return invalid_argument(fmt::format(
        "config {}: price_per_gpu_hour: expected an object of GPU models and dollars", name));
  }
  Prices out;
  for (const auto& [model, price] : table->items()) {
    const double v = price.is_number() ? price.get<double>() : 0;
    if (!(v > 0) || !std::isfinite(v)) {
      return invalid_argument(fmt::format(
          "config {}: price_per_gpu_hour.{}: {} is not a price (dollars per GPU-hour, e.g. 2.49)",
          name, model, price.dump()));
    }
    if (model == "default") {
      out.fallback = v;
    } else {
      out.per_gpu[model] = v;
    }
  }
  return out;
}

std::optional<double> joules_per_image(const Entry& entry) {
  if (!entry.energy_j || !entry.items || !(*entry.items > 0)) return std::nullopt;
  return *entry.energy_j / *entry.items;
}

namespace {

std::string text_of(const std::optional<std::string>& v) {
  return v.value_or("");
}

std::string number_text(const std::optional<double>& v) {
  return v ? fmt::format("{:g}", *v) : "";
}

void note(std::vector<Change>& out, std::string what, std::string before, std::string after) {
  if (before != after) out.push_back({std::move(what), std::move(before), std::move(after)});
}

std::string runtime_of(const results::Context& c) {
  return c.container ? c.container->runtime : "";
}

// The image with its digest, as one value: a new tag and a rebuilt image under the same tag are
// each one change.
std::string image_of(const results::Context& c) {
  if (!c.container) return "";
  const results::Container& k = *c.container;
  if (k.digest.empty()) return k.image;
  return k.image.empty() ? k.digest : fmt::format("{} ({})", k.image, k.digest);
}

std::string gpu_names(const results::Context& c) {
  std::string out;
  for (const auto& g : c.gpus) out += (out.empty() ? "" : ", ") + g.name;
  return out;
}

}  // namespace

std::vector<Change> environment_diff(const results::Context& before,
                                     const results::Context& after) {
  std::vector<Change> out;
  note(out, "machine", before.hostname, after.hostname);
  note(out, "container", runtime_of(before), runtime_of(after));
  note(out, "container image", image_of(before), image_of(after));
  note(out, "GPUs", gpu_names(before), gpu_names(after));
  note(out, "driver", text_of(before.driver_version), text_of(after.driver_version));
  note(out, "CUDA (driver)", text_of(before.cuda_driver_version),
       text_of(after.cuda_driver_version));
  note(out, "CUDA (runtime)", text_of(before.cuda_runtime_version),
       text_of(after.cuda_runtime_version));
  // Every library either run names, in the order the first run lists them.
  std::vector<std::string> names;
  for (const auto* c : {&before, &after}) {
    for (const auto& l : c->libraries) {
      if (std::find(names.begin(), names.end(), l.name) == names.end()) names.push_back(l.name);
    }
  }
  const auto version = [](const results::Context& c, const std::string& name) {
    for (const auto& l : c.libraries) {
      if (l.name == name) return l.version;
    }
    return std::string();
  };
  for (const auto& n : names) note(out, n, version(before, n), version(after, n));
  note(out, "dlprobe", before.dlprobe_version, after.dlprobe_version);
  note(out, "dlprobe build", before.git_hash, after.git_hash);
  note(out, "OS", before.os, after.os);
  note(out, "CPU", before.cpu, after.cpu);
  std::set<int> gpus;
  for (const auto* c : {&before, &after}) {
    for (const auto& s : c->device_state) gpus.insert(s.gpu);
  }
  const auto state = [](const results::Context& c, int gpu) -> const results::DeviceState* {
    for (const auto& s : c.device_state) {
      if (s.gpu == gpu) return &s;
    }
    return nullptr;
  };
  for (int g : gpus) {
    const results::DeviceState* a = state(before, g);
    const results::DeviceState* b = state(after, g);
    const auto field = [](const results::DeviceState* s,
                          std::optional<double> results::DeviceState::*f) {
      return s == nullptr ? std::string() : number_text(s->*f);
    };
    note(out, fmt::format("GPU {} power limit (W)", g),
         field(a, &results::DeviceState::power_limit_w),
         field(b, &results::DeviceState::power_limit_w));
    note(out, fmt::format("GPU {} SM clock at start (MHz)", g),
         field(a, &results::DeviceState::sm_clock_mhz),
         field(b, &results::DeviceState::sm_clock_mhz));
    note(out, fmt::format("GPU {} memory clock at start (MHz)", g),
         field(a, &results::DeviceState::mem_clock_mhz),
         field(b, &results::DeviceState::mem_clock_mhz));
  }
  return out;
}

std::string_view flag_name(Flag flag) {
  switch (flag) {
    case Flag::regression:
      return "REGRESSION";
    case Flag::improvement:
      return "improvement";
    case Flag::no_change:
      return "no change";
    case Flag::too_few:
      return "too few results";
  }
  return "too few results";
}

namespace {

bool finished(const Entry& e) {
  return e.status == "ok" && e.throughput && *e.throughput > 0;
}

Status check(const TrendOptions& o) {
  if (!(o.alpha > 0 && o.alpha < 1)) {
    return invalid_argument(fmt::format("alpha must be between 0 and 1, got {}", o.alpha));
  }
  if (!(o.noise >= 0 && o.noise < 1)) {
    return invalid_argument(fmt::format("noise threshold must be in [0, 1), got {}", o.noise));
  }
  if (o.window < 1)
    return invalid_argument(fmt::format("window must be 1 or more, got {}", o.window));
  return Status::ok();
}

// Compares the latest finished point of `s` with the finished ones before it (see trend()).
Status judge(const History& history, const TrendOptions& options, Series& s) {
  std::vector<const Entry*> done;
  for (const auto& p : s.points) {
    if (finished(p)) done.push_back(&p);
  }
  if (done.size() < 2) return Status::ok();
  const Entry& latest = *done.back();
  const std::size_t window = std::min(done.size() - 1, static_cast<std::size_t>(options.window));
  const std::span<const Entry* const> base(done.data() + done.size() - 1 - window, window);
  s.window = static_cast<int>(window);
  s.flag = Flag::no_change;
  double items = 0, seconds = 0, lowest = INFINITY, highest = 0;
  for (const Entry* e : base) {
    if (e->items) {
      items += *e->items;
      seconds += *e->items / *e->throughput;
    }
    lowest = std::min(lowest, *e->throughput);
    highest = std::max(highest, *e->throughput);
  }
  if (!(items > 0) || !(seconds > 0)) return Status::ok();
  s.ratio = *latest.throughput / (items / seconds);
  const bool slower = *s.ratio < 1 - options.noise && *latest.throughput < lowest;
  const bool faster = *s.ratio > 1 + options.noise && *latest.throughput > highest;
  if (!slower && !faster) return Status::ok();

  std::vector<double> base_seconds, base_items;
  for (const Entry* e : base) {
    DLPROBE_ASSIGN_OR_RETURN(results::Document d, history.document(e->id));
    const auto& samples = d.configurations.front().samples;
    base_seconds.insert(base_seconds.end(), samples.step_seconds.begin(),
                        samples.step_seconds.end());
    base_items.insert(base_items.end(), samples.step_items.begin(), samples.step_items.end());
  }
  DLPROBE_ASSIGN_OR_RETURN(results::Document last, history.document(latest.id));
  const auto& samples = last.configurations.front().samples;
  if (base_seconds.empty() || samples.step_seconds.empty()) return Status::ok();
  auto ratio = stats::throughput_ratio(base_seconds, base_items, samples.step_seconds,
                                       samples.step_items, options.bootstrap);
  if (!ratio) return ratio.status().with_context(s.configuration);
  auto mw = stats::mann_whitney_u(base_seconds, samples.step_seconds);
  if (!mw) return mw.status().with_context(s.configuration);
  s.ratio_ci = ratio->ci;
  s.p_value = mw->p_value;
  if (ratio->ci.contains(1.0) || !(mw->p_value < options.alpha)) return Status::ok();
  s.flag = slower ? Flag::regression : Flag::improvement;
  // What changed since the result before: beside a flag, the likely cause.
  DLPROBE_ASSIGN_OR_RETURN(results::Document before, history.document(done[done.size() - 2]->id));
  s.changes = environment_diff(before.context, last.context);
  return Status::ok();
}

}  // namespace

Result<std::vector<Series>> trend(const History& history, const Filter& filter,
                                  const TrendOptions& options) {
  DLPROBE_RETURN_IF_ERROR(check(options));
  DLPROBE_ASSIGN_OR_RETURN(std::vector<Entry> entries, history.list(filter));
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> index;
  std::vector<Series> out;
  for (auto& e : entries) {
    auto key = std::make_tuple(e.machine, e.gpu, e.configuration);
    auto [it, fresh] = index.try_emplace(std::move(key), out.size());
    if (fresh) {
      Series s;
      s.machine = e.machine;
      s.gpu = e.gpu;
      s.configuration = e.configuration;
      out.push_back(std::move(s));
    }
    out[it->second].points.push_back(std::move(e));
  }
  // The series are judged on every core: a flagged one costs a bootstrap of its steps (tens of
  // milliseconds), and a night that slows every configuration flags them all. The connection
  // serializes its own use (SQLITE_OPEN_FULLMUTEX); the statistics share nothing.
  std::vector<Status> failures(out.size());
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i = next++; i < out.size(); i = next++) {
      failures[i] = judge(history, options, out[i]);
    }
  };
  const std::size_t workers =
      std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), out.size());
  std::vector<std::thread> threads;
  for (std::size_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  for (const Status& f : failures) DLPROBE_RETURN_IF_ERROR(f);
  return out;
}

bool any_regression(const std::vector<Series>& series) {
  return std::any_of(series.begin(), series.end(),
                     [](const Series& s) { return s.flag == Flag::regression; });
}

}  // namespace dlprobe::history
