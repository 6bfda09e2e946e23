// `dlprobe compare BASE.json NEW.json [--fail-above 3%]`: per matching configuration the throughput
// ratio with its CI, the Mann–Whitney U p-value and a verdict; exit 1 when a regression is larger
// than --fail-above, so CI can gate on it.
#include <fmt/format.h>

#include <cstdio>

#include "commands.h"
#include "dlprobe/core/units.h"
#include "dlprobe/report/compare.h"

namespace dlprobe::cli {

Command add_compare_command(CLI::App& app) {
  struct Flags {
    std::string base;
    std::string next;
    std::string fail_above;
    std::string alpha = "0.05";
    std::string noise = "1%";
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "compare", "Compare two results files configuration by configuration; gate on regressions");
  sub->add_option("base", flags->base, "Baseline results file")->required();
  sub->add_option("new", flags->next, "New results file")->required();
  sub->add_option("--fail-above", flags->fail_above,
                  "Exit 1 when a configuration is significantly slower by more than this "
                  "(e.g. 3% or 0.03), or ran in the base but did not finish in the new file");
  option(*sub, "--alpha", flags->alpha, "Significance level of the Mann-Whitney U test");
  option(*sub, "--noise", flags->noise,
         "A difference smaller than this is no change, however significant (e.g. 2%)");
  sub->add_flag("--json", flags->json, "Print the comparison as JSON (schema dlprobe.compare/1)");

  Command command;
  command.app = sub;
  command.run = [flags]() -> int {
    std::optional<double> fail_above;
    if (!flags->fail_above.empty()) {
      auto f = parse_fraction(flags->fail_above, "--fail-above");
      if (!f) return report_error(f.status());
      fail_above = *f;
    }
    auto alpha = parse_alpha(flags->alpha);
    if (!alpha) return report_error(alpha.status());
    auto noise = parse_noise(flags->noise);
    if (!noise) return report_error(noise.status());
    report::CompareOptions options;
    options.alpha = *alpha;
    options.noise = *noise;
    auto base = results::read_file(flags->base);
    if (!base) return report_error(base.status());
    auto next = results::read_file(flags->next);
    if (!next) return report_error(next.status());
    auto comparison = report::compare(*base, *next, options);
    if (!comparison) {
      return report_error(
          comparison.status().with_context(fmt::format("{} vs {}", flags->base, flags->next)));
    }
    const std::string text = flags->json ? report::comparison_json(*comparison).dump(2) + "\n"
                                         : report::render_comparison_text(*comparison);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (!fail_above) return kExitOk;
    int regressions = 0;
    for (const auto& row : comparison->rows) {
      if (row.lost) {
        ++regressions;
        std::fprintf(stderr,
                     "dlprobe: regression: %s ran in the base but not in the new file (%s)\n",
                     results::describe(row.kind, row.settings).c_str(),
                     row.new_status == results::RunStatus::ok
                         ? "no timed steps"
                         : std::string(results::run_status_name(row.new_status)).c_str());
        continue;
      }
      const double drop = report::regression(row);
      if (drop > *fail_above) {
        ++regressions;
        std::fprintf(stderr, "dlprobe: regression: %s is %.1f%% slower (limit %.1f%%)\n",
                     results::describe(row.kind, row.settings).c_str(), drop * 100,
                     *fail_above * 100);
      }
    }
    return regressions > 0 ? kExitFailure : kExitOk;
  };
  return command;
}

}  // namespace dlprobe::cli
