#include "dlprobe/results/table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "dlprobe/allocator/caching_allocator.h"
#include "dlprobe/core/units.h"

namespace dlprobe::results {

std::optional<std::int64_t> peak_memory_bytes(const Memory& memory) {
  if (memory.allocator_stats.is_object()) {
    const auto it = memory.allocator_stats.find("allocated_bytes.all.peak");
    if (it != memory.allocator_stats.end() && it->is_number_integer()) {
      return it->get<std::int64_t>();
    }
  }
  if (memory.framework_peak_allocated_bytes) return memory.framework_peak_allocated_bytes;
  return memory.nvml_process_peak_bytes;
}

std::optional<double> energy_j(const Configuration& configuration) {
  std::optional<double> total;
  for (const Telemetry& t : configuration.telemetry) {
    if (!t.energy_j) return std::nullopt;
    total = total.value_or(0) + *t.energy_j;
  }
  return total;
}

namespace {

// A bytes figure of a memory.arena object, or none where the key is missing or not an integer.
std::optional<std::int64_t> bytes_at(const nlohmann::json& j, std::string_view key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int64_t>();
}

// memory.arena's contents as parts of the arena's `block` bytes: the activations, backward
// gradients and other temporaries live at its fullest, and its free rest; none unless they add up
// to the block (a file from elsewhere, or one where the allocator's arena is not the plan's). From
// the file's JSON, so not memory::arena_parts (results sits below memory), with its part names.
std::vector<std::pair<std::string, std::int64_t>> arena_parts(const nlohmann::json& arena,
                                                              std::int64_t block) {
  std::vector<std::pair<std::string, std::int64_t>> parts;
  if (!arena.is_object() || bytes_at(arena, "block_bytes") != block) return parts;
  const auto live = arena.find("live_by_category");
  if (live == arena.end() || !live->is_object()) return parts;
  const std::optional<std::int64_t> gradients = bytes_at(arena, "live_gradient_bytes");
  const std::optional<std::int64_t> free = bytes_at(arena, "free_bytes");
  if (!gradients || !free) return parts;
  std::int64_t sum = *free;
  for (const auto category : memory::kAllCategories) {
    const std::optional<std::int64_t> bytes = bytes_at(*live, memory::category_name(category));
    if (!bytes) return {};
    sum += *bytes;
    if (*bytes == 0) continue;
    const std::string name(memory::category_name(category));
    if (category == memory::Category::temporaries) {
      if (*gradients > 0) parts.emplace_back("arena: backward gradients", *gradients);
      if (*bytes > *gradients) parts.emplace_back("arena: other temporaries", *bytes - *gradients);
    } else {
      parts.emplace_back("arena: " + name, *bytes);
    }
  }
  if (sum != block) return {};
  parts.emplace_back("arena: free", *free);
  return parts;
}

}  // namespace

std::vector<std::pair<std::string, std::int64_t>> peak_by_category(const Memory& memory) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  if (!memory.allocator_stats.is_object()) return out;
  for (const auto category : memory::kAllCategories) {
    const std::string name(memory::category_name(category));
    const auto it = memory.allocator_stats.find("peak.allocated_bytes." + name);
    if (it == memory.allocator_stats.end() || !it->is_number_integer()) continue;
    const auto bytes = it->get<std::int64_t>();
    if (category == memory::Category::arena) {
      const auto parts = arena_parts(memory.arena, bytes);
      if (!parts.empty()) {
        out.insert(out.end(), parts.begin(), parts.end());
        continue;
      }
    }
    out.emplace_back(name, bytes);
  }
  return out;
}

namespace {

Cell text(std::string s) {
  return {std::move(s), std::nullopt};
}
Cell number(double v, std::string shown) {
  return {std::move(shown), v};
}
Cell empty() {
  return {};
}

Cell optional_number(const std::optional<double>& v, std::string_view format) {
  if (!v) return empty();
  return number(*v, fmt::format(fmt::runtime(format), *v));
}

// FLOP/s with the prefix that suits the figure: a GPU's 312.5 TFLOP/s, a CPU's 41.2 GFLOP/s (in
// TFLOP/s, "0.0").
Cell flops(const std::optional<double>& tflops) {
  if (!tflops) return empty();
  const double v = *tflops * 1e12;
  constexpr std::pair<double, const char*> kPrefixes[] = {
      {1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  for (const auto& [scale, prefix] : kPrefixes) {
    if (std::abs(v) >= scale) return number(v, fmt::format("{:.1f} {}FLOP/s", v / scale, prefix));
  }
  return number(v, fmt::format("{:.0f} FLOP/s", v));
}

std::vector<Cell> row(const Configuration& c) {
  std::vector<Cell> r;
  r.push_back(text(std::string(kind_name(c.kind))));
  r.push_back(text(describe(c.kind, c.settings)));
  r.push_back(text(c.kind == Kind::native ? c.settings.model : c.settings.command));
  const auto batch = batch_of(c.kind, c.settings);
  r.push_back(batch ? number(static_cast<double>(*batch), std::to_string(*batch)) : empty());
  r.push_back(text(precision_of(c.kind, c.settings)));
  r.push_back(text(c.settings.mode));
  r.push_back(text(std::string(run_status_name(c.status))));
  if (c.statistics) {
    const auto& s = *c.statistics;
    r.push_back(number(s.throughput, format_grouped(s.throughput, 1)));
    r.push_back(number(s.throughput_ci.low, format_grouped(s.throughput_ci.low, 1)));
    r.push_back(number(s.throughput_ci.high, format_grouped(s.throughput_ci.high, 1)));
    if (c.run_spread) {
      r.push_back(number(c.run_spread->ci.low, format_grouped(c.run_spread->ci.low, 1)));
      r.push_back(number(c.run_spread->ci.high, format_grouped(c.run_spread->ci.high, 1)));
      // Fresh engines in one process, or fresh processes: which spread the interval is.
      r.push_back(text(std::string(runs_in_name(c.runs_in.value_or(RunsIn::engines)))));
    } else {
      r.insert(r.end(), 3, empty());
    }
    r.push_back(number(s.median_s * 1e3, fmt::format("{:.3f}", s.median_s * 1e3)));
    r.push_back(number(s.p90_s * 1e3, fmt::format("{:.3f}", s.p90_s * 1e3)));
    r.push_back(number(s.p99_s * 1e3, fmt::format("{:.3f}", s.p99_s * 1e3)));
    r.push_back(number(s.cv * 100, fmt::format("{:.2f}", s.cv * 100)));
    r.push_back(number(static_cast<double>(s.outliers), std::to_string(s.outliers)));
    r.push_back(number(static_cast<double>(s.steps), std::to_string(s.steps)));
  } else {
    for (int i = 0; i < 12; ++i) r.push_back(empty());
  }
  const auto peak = c.memory ? peak_memory_bytes(*c.memory) : std::nullopt;
  r.push_back(peak ? number(static_cast<double>(*peak), format_size(static_cast<std::uint64_t>(
                                                            std::max<std::int64_t>(*peak, 0))))
                   : empty());
  r.push_back(c.compute ? flops(c.compute->achieved_tflops) : empty());
  r.push_back(c.compute && c.compute->fraction_of_ceiling
                  ? number(*c.compute->fraction_of_ceiling * 100,
                           fmt::format("{:.1f}", *c.compute->fraction_of_ceiling * 100))
                  : empty());
  // The first GPU's figures: a native run uses one, an external one mostly does too.
  const Telemetry* gpu = c.telemetry.empty() ? nullptr : &c.telemetry.front();
  const auto median_of = [](const std::optional<Range>& range) -> std::optional<double> {
    if (!range) return std::nullopt;
    return range->median;
  };
  r.push_back(optional_number(gpu ? median_of(gpu->power_w) : std::nullopt, "{:.0f}"));
  // Every GPU's energy over the items they made together: one GPU's share over all the items
  // would halve it for a run on two.
  const std::optional<double> energy = energy_j(c);
  std::optional<double> energy_per_item;
  if (energy && c.statistics && c.statistics->total_items > 0) {
    energy_per_item = *energy / c.statistics->total_items;
  }
  r.push_back(optional_number(energy_per_item, "{:.4f}"));
  r.push_back(optional_number(gpu ? median_of(gpu->gpu_util_pct) : std::nullopt, "{:.0f}"));
  r.push_back(optional_number(gpu ? median_of(gpu->sm_clock_mhz) : std::nullopt, "{:.0f}"));
  r.push_back(text(c.error));
  return r;
}

}  // namespace

Table configuration_table(std::span<const NamedDocument> documents) {
  Table t;
  const bool several = documents.size() > 1;
  if (several) t.columns.push_back("file");
  for (const char* column : {"kind",
                             "configuration",
                             "model / command",
                             "batch",
                             "precision",
                             "mode",
                             "status",
                             "throughput (items/s)",
                             "CI low (within steps)",
                             "CI high (within steps)",
                             "CI low (between runs)",
                             "CI high (between runs)",
                             "runs in",
                             "median step (ms)",
                             "p90 step (ms)",
                             "p99 step (ms)",
                             "CV (%)",
                             "outliers",
                             "steps",
                             "peak memory",
                             "compute (FLOP/s)",
                             "of ceiling (%)",
                             "median power (W)",
                             "energy (J/item)",
                             "median GPU util (%)",
                             "median SM clock (MHz)",
                             "error"}) {
    t.columns.emplace_back(column);
  }
  for (const auto& d : documents) {
    for (const auto& c : d.document.configurations) {
      auto r = row(c);
      if (several) r.insert(r.begin(), text(d.name));
      t.rows.push_back(std::move(r));
    }
  }
  return t;
}

Table without_empty_columns(const Table& table) {
  std::vector<bool> keep(table.columns.size(), false);
  for (const auto& r : table.rows) {
    for (std::size_t i = 0; i < r.size() && i < keep.size(); ++i) {
      keep[i] = keep[i] || r[i].number.has_value() || !r[i].text.empty();
    }
  }
  Table out;
  for (std::size_t i = 0; i < table.columns.size(); ++i) {
    if (keep[i]) out.columns.push_back(table.columns[i]);
  }
  for (const auto& r : table.rows) {
    std::vector<Cell> kept;
    for (std::size_t i = 0; i < r.size() && i < keep.size(); ++i) {
      if (keep[i]) kept.push_back(r[i]);
    }
    out.rows.push_back(std::move(kept));
  }
  return out;
}

namespace {

std::string csv_field(const Cell& cell) {
  if (cell.number) return fmt::format("{}", *cell.number);
  const std::string& s = cell.text;
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    line += fields[i];
  }
  return line + "\r\n";
}

std::string markdown_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '\n' || ch == '\r') {
      out += ' ';
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace

std::string to_csv(const Table& table) {
  std::vector<std::string> header;
  for (const auto& c : table.columns) header.push_back(csv_field(text(c)));
  std::string out = csv_line(header);
  for (const auto& r : table.rows) {
    std::vector<std::string> fields;
    for (const auto& cell : r) fields.push_back(csv_field(cell));
    out += csv_line(fields);
  }
  return out;
}

std::string to_markdown(const Table& table) {
  std::string out = "|";
  for (const auto& c : table.columns) out += " " + markdown_escape(c) + " |";
  out += "\n|";
  for (std::size_t i = 0; i < table.columns.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& r : table.rows) {
    out += "|";
    for (const auto& cell : r) out += " " + markdown_escape(cell.text) + " |";
    out += "\n";
  }
  return out;
}

}  // namespace dlprobe::results
