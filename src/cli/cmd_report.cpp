// `dlprobe report RESULTS.json... -o FILE`: the HTML report (or the configuration table as
// Markdown or CSV), chosen by FILE's extension, from one or more results files merged.
#include <fmt/format.h>

#include <filesystem>
#include <set>

#include "commands.h"
#include "dlprobe/report/html.h"
#include "dlprobe/results/table.h"

namespace dlprobe::cli {

Command add_report_command(CLI::App& app) {
  struct Flags {
    std::vector<std::string> inputs;
    std::string output;
    bool overwrite = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "report", "Turn results files into one self-contained HTML report (or Markdown / CSV)");
  sub->add_option("results", flags->inputs, "Results files (dlprobe.results/1), merged in order")
      ->required();
  sub->add_option("-o,--output", flags->output,
                  "Output file: .html (report), .md (Markdown table) or .csv (CSV table)")
      ->required();
  add_overwrite_flag(*sub, flags->overwrite);

  Command command;
  command.app = sub;
  command.run = [flags]() -> int {
    const std::filesystem::path out(flags->output);
    const std::string ext = out.extension().string();
    if (is_stdout_path(out)) {
      return report_error(invalid_argument(
          "-o -: the format comes from the file's extension (.html, .md or .csv), which standard "
          "output has not"));
    }
    if (ext != ".html" && ext != ".htm" && ext != ".md" && ext != ".csv") {
      return report_error(invalid_argument(fmt::format(
          "-o {}: unknown extension '{}' (use .html, .md or .csv)", flags->output, ext)));
    }
    if (Status s = prepare_outputs({{"-o", flags->output}}, flags->overwrite); !s) {
      return report_error(s);
    }
    // Files are named by their base name in charts and tables; the full paths only when two
    // base names are the same.
    std::set<std::string> base_names;
    for (const auto& input : flags->inputs) {
      base_names.insert(std::filesystem::path(input).filename().string());
    }
    const bool short_names = base_names.size() == flags->inputs.size();
    std::vector<results::NamedDocument> documents;
    for (const auto& input : flags->inputs) {
      auto document = results::read_file(input);
      if (!document) return report_error(document.status());
      documents.push_back({short_names ? std::filesystem::path(input).filename().string() : input,
                           std::move(*document)});
    }
    std::string text;
    if (ext == ".md") {
      text = results::to_markdown(results::configuration_table(documents));
    } else if (ext == ".csv") {
      text = results::to_csv(results::configuration_table(documents));
    } else {
      text = report::render_html(documents);
    }
    if (auto s = write_file_atomic(out, text); !s) return report_error(s);
    std::fprintf(stderr, "dlprobe: wrote %s\n", flags->output.c_str());
    return kExitOk;
  };
  return command;
}

}  // namespace dlprobe::cli
