// `dlprobe history`: the results evaluate, bench, memory and run stored (src/history), listed and
// filtered, followed as a trend per configuration with a regression flag (exit 1, for cron and
// CI), told apart (what changed between two results), imported from other machines' results
// files, and priced per GPU-hour. docs/history.md.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "dlprobe/core/units.h"
#include "dlprobe/history/history.h"
#include "dlprobe/history/text.h"
#include "dlprobe/history/trend.h"
#include "dlprobe/report/trend_chart.h"

namespace dlprobe::cli {
namespace {

struct HistoryCommandFlags {
  std::string file;
  std::string config;
  // Filters of list and trend.
  std::string machine, gpu, driver, model, precision, batch, since, until;
  std::string price;
  // trend
  std::string alpha = "0.05";
  std::string noise = "1%";
  std::string window = "5";
  std::string html;
  bool overwrite = false;
  // import
  std::vector<std::string> imports;
  // diff
  std::string first, second;
};

Result<std::filesystem::path> database(const HistoryCommandFlags& f) {
  if (!f.file.empty()) return std::filesystem::path(f.file);
  return history::default_path();
}

Result<history::History> open_existing(const HistoryCommandFlags& f) {
  DLPROBE_ASSIGN_OR_RETURN(const std::filesystem::path path, database(f));
  history::OpenOptions options;
  options.create = false;
  return history::History::open(path, options);
}

Result<history::Filter> filter_of(const HistoryCommandFlags& f) {
  history::Filter out;
  out.machine = f.machine;
  out.gpu = f.gpu;
  out.driver = f.driver;
  out.model = f.model;
  out.precision = f.precision;
  out.since = f.since;
  out.until = f.until;
  if (!f.batch.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(out.batch, parse_int(f.batch, "--batch", 1, std::int64_t{1} << 40));
  }
  return out;
}

// --price-per-hour for every row, else the config file's prices per GPU model. A file named by
// --config must be there; the default one may be missing.
Result<history::Prices> price_of(const HistoryCommandFlags& f) {
  if (!f.price.empty()) {
    char* end = nullptr;
    const double v = std::strtod(f.price.c_str(), &end);
    if (end == f.price.c_str() || *end != '\0' || !(v > 0) || !std::isfinite(v)) {
      return invalid_argument(fmt::format(
          "--price-per-hour '{}': not a price (dollars per GPU-hour, e.g. 2.49)", f.price));
    }
    history::Prices flat;
    flat.flat = v;
    return flat;
  }
  if (!f.config.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(f.config, ec)) {
      return error(Errc::not_found, fmt::format("config {}: no such file", f.config));
    }
    return history::read_prices(f.config);
  }
  auto path = history::default_config_path();
  if (!path) return history::Prices{};
  return history::read_prices(*path);
}

int print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kExitOk;
}

int run_list(const HistoryCommandFlags& f) {
  auto filter = filter_of(f);
  if (!filter) return report_error(filter.status());
  auto price = price_of(f);
  if (!price) return report_error(price.status());
  auto h = open_existing(f);
  if (!h) return report_error(h.status());
  auto rows = h->list(*filter);
  if (!rows) return report_error(rows.status());
  return print(history::render_list(*rows, *price));
}

// The trend as report::render_trend_html draws it: a line per series, each finished result with a
// throughput a point.
std::vector<report::TrendLine> trend_lines(const std::vector<history::Series>& series) {
  std::vector<report::TrendLine> lines;
  for (const auto& s : series) {
    report::TrendLine line;
    line.name =
        fmt::format("{}, {}: {}", s.machine, s.gpu.empty() ? "CPU" : s.gpu, s.configuration);
    for (const auto& e : s.points) {
      if (!e.throughput) continue;
      line.points.push_back(
          {e.date, *e.throughput, e.ci_low, e.ci_high,
           fmt::format("#{}{}", e.id, e.driver.empty() ? "" : ", driver " + e.driver)});
    }
    line.regression = s.flag == history::Flag::regression;
    line.verdict = history::trend_verdict(s);
    lines.push_back(std::move(line));
  }
  return lines;
}

int run_trend(const HistoryCommandFlags& f) {
  if (!f.html.empty()) {
    const Result<std::filesystem::path> db = database(f);
    const Result<std::filesystem::path> config =
        f.config.empty() ? history::default_config_path() : std::filesystem::path(f.config);
    if (Status s = prepare_outputs({{"--html", f.html}}, f.overwrite,
                                   {{f.file.empty() ? "the default history" : "--history",
                                     db ? *db : std::filesystem::path()},
                                    {f.config.empty() ? "the default config" : "--config",
                                     config ? *config : std::filesystem::path()}});
        !s) {
      return report_error(s);
    }
  }
  auto filter = filter_of(f);
  if (!filter) return report_error(filter.status());
  auto price = price_of(f);
  if (!price) return report_error(price.status());
  history::TrendOptions options;
  auto alpha = parse_alpha(f.alpha);
  if (!alpha) return report_error(alpha.status());
  auto noise = parse_noise(f.noise);
  if (!noise) return report_error(noise.status());
  auto window = parse_int(f.window, "--window", 1, 1000);
  if (!window) return report_error(window.status());
  options.alpha = *alpha;
  options.noise = *noise;
  options.window = static_cast<int>(*window);
  auto h = open_existing(f);
  if (!h) return report_error(h.status());
  auto series = history::trend(*h, *filter, options);
  if (!series) return report_error(series.status());
  print(history::render_trend(*series, *price));
  if (!f.html.empty()) {
    auto path = database(f);
    if (!path) return report_error(path.status());
    const std::string page = report::render_trend_html(
        fmt::format("{} series from {}", series->size(), path->string()), trend_lines(*series));
    if (Status s = write_file_atomic(f.html, page); !s) return report_error(s);
    std::fprintf(stderr, "dlprobe: wrote %s\n", f.html.c_str());
  }
  if (!history::any_regression(*series)) return kExitOk;
  std::fprintf(stderr,
               "dlprobe: regression: the latest result of a configuration is slower than "
               "its history beyond noise\n");
  return kExitFailure;
}

int run_import(const HistoryCommandFlags& f) {
  auto path = database(f);
  if (!path) return report_error(path.status());
  auto h = history::History::open(*path);
  if (!h) return report_error(h.status());
  history::Added total;
  int failed = 0;
  for (const auto& file : f.imports) {
    auto added = history::import_file(*h, file);
    if (!added) {
      // Each file stands alone: one that is not results is named, and the others still go in.
      report_error(added.status());
      ++failed;
      continue;
    }
    total.added += added->added;
    total.already += added->already;
  }
  std::printf("added %d result%s from %zu file%s to %s", total.added, total.added == 1 ? "" : "s",
              f.imports.size() - static_cast<std::size_t>(failed),
              f.imports.size() - static_cast<std::size_t>(failed) == 1 ? "" : "s", path->c_str());
  if (total.already > 0) std::printf(" (%d already there)", total.already);
  std::printf("\n");
  return failed > 0 ? kExitError : kExitOk;
}

int run_diff(const HistoryCommandFlags& f) {
  auto a = parse_int(f.first, "first result", 1, INT64_MAX);
  if (!a) return report_error(a.status());
  auto b = parse_int(f.second, "second result", 1, INT64_MAX);
  if (!b) return report_error(b.status());
  auto h = open_existing(f);
  if (!h) return report_error(h.status());
  auto before = h->document(*a);
  if (!before) return report_error(before.status());
  auto after = h->document(*b);
  if (!after) return report_error(after.status());
  return print(fmt::format("#{} -> #{}: ", *a, *b) +
               history::render_changes(history::environment_diff(before->context, after->context)));
}

void add_filters(CLI::App& sub, HistoryCommandFlags& f) {
  add_text_options<HistoryCommandFlags>(
      sub, f,
      {{"--machine", &HistoryCommandFlags::machine, "Machines whose name holds this"},
       {"--gpu", &HistoryCommandFlags::gpu, "GPU models whose name holds this (e.g. h200)"},
       {"--driver", &HistoryCommandFlags::driver, "Drivers whose version holds this"},
       {"--model", &HistoryCommandFlags::model, "This model only (e.g. resnet50)"},
       {"--precision", &HistoryCommandFlags::precision, "This precision only (e.g. bf16)"},
       {"--batch", &HistoryCommandFlags::batch, "This batch only"},
       {"--since", &HistoryCommandFlags::since, "From this date (2026-03-01) or UTC time on"},
       {"--until", &HistoryCommandFlags::until, "Up to this date (its whole day) or UTC time"},
       {"--price-per-hour", &HistoryCommandFlags::price,
        "Dollars per GPU-hour: adds $ per million images and per ImageNet epoch (over the "
        "config file's prices)"}});
}

}  // namespace

Command add_history_command(CLI::App& app) {
  auto f = std::make_shared<HistoryCommandFlags>();
  CLI::App* sub = app.add_subcommand(
      "history", "The results of earlier runs: list, trend with a regression flag, diff, import");
  sub->require_subcommand(1);
  // --history may come after the subcommand too: `dlprobe history list --history FILE`.
  sub->fallthrough();
  sub->add_option("--history", f->file,
                  "The history database (default: $XDG_DATA_HOME/dlprobe/history.sqlite, else "
                  "~/.local/share/dlprobe/history.sqlite)");
  sub->add_option("--config", f->config,
                  "The config file with prices per GPU-hour (default: "
                  "$XDG_CONFIG_HOME/dlprobe/config.json, else ~/.config/dlprobe/config.json)");
  CLI::App* list = sub->add_subcommand("list", "One line per stored result, oldest first");
  add_filters(*list, *f);
  CLI::App* trend = sub->add_subcommand(
      "trend",
      "Each configuration over time, the latest result compared with those before it; exit 1 "
      "on a regression");
  add_filters(*trend, *f);
  option(*trend, "--alpha", f->alpha, "Significance level of the Mann-Whitney U test");
  option(*trend, "--noise", f->noise,
         "A drop smaller than this is no regression, however significant (e.g. 2%)");
  option(*trend, "--window", f->window, "How many earlier results the latest is compared with");
  trend->add_option("--html", f->html,
                    "Also write the trend as a self-contained HTML page: throughput over time per "
                    "series, its CI as a band, regressions marked ('-': standard output)");
  add_overwrite_flag(*trend, f->overwrite);
  CLI::App* import = sub->add_subcommand(
      "import", "Add results files (from this machine or others) to the history");
  import->add_option("files", f->imports, "Results files (dlprobe.results/1)")->required();
  CLI::App* diff = sub->add_subcommand(
      "diff", "What differs in the environment of two results (numbers from history list)");
  diff->add_option("first", f->first, "The earlier result's number")->required();
  diff->add_option("second", f->second, "The later result's number")->required();
  return {sub, [f, list, trend, import, diff] {
            if (list->parsed()) return run_list(*f);
            if (trend->parsed()) return run_trend(*f);
            if (import->parsed()) return run_import(*f);
            if (diff->parsed()) return run_diff(*f);
            return kExitError;
          }};
}

}  // namespace dlprobe::cli
