#include "dlprobe/history/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>

#include "dlprobe/core/units.h"

namespace dlprobe::history {

namespace {

// Columns aligned on their widest cell: text to the left, numbers to the right.
class Columns {
 public:
  explicit Columns(std::vector<std::pair<std::string, bool>> header) {
    for (auto& [name, right] : header) {
      right_.push_back(right);
      width_.push_back(name.size());
      head_.push_back(std::move(name));
    }
  }
  void add(std::vector<std::string> row) {
    // The cells come from results files of any origin: their control characters are shown, not
    // sent to the terminal (an escape sequence that retitles it, a newline that forges a row).
    for (std::string& cell : row) cell = one_line(cell);
    for (std::size_t i = 0; i < row.size(); ++i) width_[i] = std::max(width_[i], row[i].size());
    rows_.push_back(std::move(row));
  }
  std::string render(const std::string& indent) const {
    std::string out = line(head_, indent);
    for (const auto& r : rows_) out += line(r, indent);
    return out;
  }

 private:
  std::string line(const std::vector<std::string>& cells, const std::string& indent) const {
    std::string out = indent;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out += right_[i] ? fmt::format("{:>{}}", cells[i], width_[i])
                       : fmt::format("{:<{}}", cells[i], width_[i]);
      if (i + 1 < cells.size()) out += "  ";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  }
  std::vector<std::string> head_;
  std::vector<bool> right_;
  std::vector<std::size_t> width_;
  std::vector<std::vector<std::string>> rows_;
};

std::string or_dash(const std::string& s) {
  return s.empty() ? "-" : s;
}

std::string throughput_text(const Entry& e) {
  return e.throughput ? format_grouped(*e.throughput, 1) : "-";
}

std::string ci_text(const Entry& e) {
  if (!e.ci_low || !e.ci_high) return "-";
  return fmt::format("[{}, {}]", format_grouped(*e.ci_low, 1), format_grouped(*e.ci_high, 1));
}

std::string median_text(const Entry& e) {
  if (!e.median_s) return "-";
  return format_duration(std::chrono::nanoseconds(static_cast<std::int64_t>(*e.median_s * 1e9)));
}

std::string memory_text(const Entry& e) {
  return e.peak_memory_bytes && *e.peak_memory_bytes >= 0
             ? format_size(static_cast<std::uint64_t>(*e.peak_memory_bytes))
             : "-";
}

std::string joules_text(const Entry& e) {
  const auto j = joules_per_image(e);
  return j ? fmt::format("{:.3g}", *j) : "-";
}

// The date without its seconds: "2026-03-01 12:34".
std::string short_date(const std::string& date) {
  if (date.size() < 16) return date;
  std::string out = date.substr(0, 16);
  out[10] = ' ';
  return out;
}

void add_cost(std::vector<std::string>& row, const Entry& e, const Prices& prices) {
  if (!prices.any()) return;
  // A run on several GPUs pays for each of them.
  const auto price = prices.of(e.gpu);
  const auto cost =
      price ? cost_at(e.throughput, *price * static_cast<double>(e.gpus)) : std::nullopt;
  row.push_back(cost ? fmt::format("{:.3f}", cost->dollars_per_million_images) : "-");
  row.push_back(cost ? fmt::format("{:.2f}", cost->dollars_per_epoch) : "-");
}

void add_cost_header(std::vector<std::pair<std::string, bool>>& header, const Prices& prices) {
  if (!prices.any()) return;
  header.emplace_back("$/M img", true);
  header.emplace_back("$/epoch", true);
}

// Which price the costs are at: "cost at $2.5 per GPU-hour" with --price-per-hour, else each GPU
// model's from the config file, "cost per GPU-hour: $3.9 on NVIDIA H200, none on ...".
std::string cost_note(const std::vector<const Entry*>& entries, const Prices& prices) {
  if (!prices.any()) return "";
  std::string used;
  if (prices.flat) {
    used = fmt::format("cost at ${:g} per GPU-hour", *prices.flat);
  } else {
    std::vector<std::string> gpus;
    for (const Entry* e : entries) {
      if (std::find(gpus.begin(), gpus.end(), e->gpu) == gpus.end()) gpus.push_back(e->gpu);
    }
    used = "cost per GPU-hour:";
    for (std::size_t i = 0; i < gpus.size(); ++i) {
      const auto price = prices.of(gpus[i]);
      used +=
          fmt::format("{} {} on {}", i == 0 ? "" : ",",
                      price ? fmt::format("${:g}", *price) : "none", one_line(or_dash(gpus[i])));
    }
  }
  return fmt::format("{}; an epoch is ImageNet's {} training images\n", used,
                     format_grouped(kImageNetEpochImages, 0));
}

}  // namespace

std::string render_list(const std::vector<Entry>& entries, const Prices& prices) {
  if (entries.empty()) return "no result in the history matches\n";
  std::vector<std::pair<std::string, bool>> header = {
      {"#", true},       {"date (UTC)", false},    {"machine", false}, {"GPU", false},
      {"driver", false}, {"configuration", false}, {"status", false},  {"img/s", true},
      {"95% CI", true},  {"median step", true},    {"peak mem", true}, {"J/img", true}};
  add_cost_header(header, prices);
  Columns table(std::move(header));
  std::vector<const Entry*> all;
  for (const auto& e : entries) {
    all.push_back(&e);
    std::vector<std::string> row = {
        std::to_string(e.id), short_date(e.date), e.machine,      or_dash(e.gpu),
        or_dash(e.driver),    e.configuration,    e.status,       throughput_text(e),
        ci_text(e),           median_text(e),     memory_text(e), joules_text(e)};
    add_cost(row, e, prices);
    table.add(std::move(row));
  }
  return table.render("") + cost_note(all, prices);
}

std::string render_changes(const std::vector<Change>& changes) {
  if (changes.empty()) return "no difference in the recorded environment\n";
  const auto one = [](const Change& c) {
    return fmt::format("{}: {} -> {}", c.what, one_line(or_dash(c.before)),
                       one_line(or_dash(c.after)));
  };
  if (changes.size() == 1) return "the one change: " + one(changes.front()) + "\n";
  std::string out = fmt::format("{} changes:\n", changes.size());
  for (const auto& c : changes) out += "  " + one(c) + "\n";
  return out;
}

std::string trend_verdict(const Series& s) {
  std::string verdict(flag_name(s.flag));
  if (s.ratio) {
    verdict += fmt::format(": latest / the {} result{} before it {:.3f}", s.window,
                           s.window == 1 ? "" : "s", *s.ratio);
  }
  if (s.ratio_ci && s.p_value) {
    verdict +=
        fmt::format(" [{:.3f}, {:.3f}], p {:.3g}", s.ratio_ci->low, s.ratio_ci->high, *s.p_value);
  }
  return verdict;
}

std::string render_trend(const std::vector<Series>& series, const Prices& prices) {
  if (series.empty()) return "no result in the history matches\n";
  std::string out;
  std::vector<const Entry*> all;
  for (const auto& s : series) {
    out += fmt::format("{} on {} ({})\n", one_line(s.configuration), one_line(s.machine),
                       one_line(or_dash(s.gpu)));
    std::vector<std::pair<std::string, bool>> header = {
        {"#", true},     {"date (UTC)", false}, {"driver", false}, {"status", false},
        {"img/s", true}, {"95% CI", true},      {"J/img", true}};
    add_cost_header(header, prices);
    Columns table(std::move(header));
    for (const auto& e : s.points) {
      all.push_back(&e);
      std::vector<std::string> row = {
          std::to_string(e.id), short_date(e.date), or_dash(e.driver), e.status,
          throughput_text(e),   ci_text(e),         joules_text(e)};
      add_cost(row, e, prices);
      table.add(std::move(row));
    }
    out += table.render("  ");
    out += "  " + trend_verdict(s) + "\n";
    if (s.flag == Flag::regression || s.flag == Flag::improvement) {
      out += "  since the result before: " + render_changes(s.changes);
    }
  }
  return out + cost_note(all, prices);
}

}  // namespace dlprobe::history
