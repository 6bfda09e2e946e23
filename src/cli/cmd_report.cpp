// `dlprobe report RESULTS.json... -o FILE`: the HTML report (or the configuration table as
// Markdown or CSV), chosen by FILE's extension, from one or more results files merged.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "commands.h"
#include "dlprobe/history/history.h"
#include "dlprobe/report/html.h"
#include "dlprobe/results/table.h"

namespace dlprobe::cli {

namespace {

// The latest finished result of each configuration on each machine, GPU, driver and CUDA of the
// history at `path`, as documents: the rows of one run (the same context) make one document, named
// by its machine and date. A fleet's results gathered with `history import` are then compared side
// by side, as their files would be.
Result<std::vector<results::NamedDocument>> latest_from_history(const std::string& path) {
  history::OpenOptions options;
  options.create = false;
  DLPROBE_ASSIGN_OR_RETURN(const history::History h, history::History::open(path, options));
  DLPROBE_ASSIGN_OR_RETURN(const std::vector<history::Entry> rows, h.list());
  std::map<std::tuple<std::string, std::string, std::string, std::string, std::string>,
           const history::Entry*>
      latest;
  for (const auto& e : rows) {
    if (e.status != "ok" || !e.throughput) continue;
    const history::Entry*& kept = latest[{e.machine, e.gpu, e.driver, e.cuda, e.configuration}];
    if (kept == nullptr || e.date >= kept->date) kept = &e;
  }
  std::vector<results::NamedDocument> out;
  for (const auto& e : rows) {
    const auto it = latest.find({e.machine, e.gpu, e.driver, e.cuda, e.configuration});
    if (it == latest.end() || it->second != &e) continue;
    DLPROBE_ASSIGN_OR_RETURN(results::Document d, h.document(e.id));
    const auto run = std::find_if(out.begin(), out.end(), [&](const auto& named) {
      return named.document.context == d.context;
    });
    if (run != out.end()) {
      for (auto& c : d.configurations) run->document.configurations.push_back(std::move(c));
      continue;
    }
    out.push_back({fmt::format("{} {}", e.machine, e.date), std::move(d)});
  }
  if (out.empty()) {
    return invalid_argument(
        fmt::format("--history {}: no finished result with a throughput to report", path));
  }
  return out;
}

}  // namespace

Command add_report_command(CLI::App& app) {
  struct Flags {
    std::vector<std::string> inputs;
    std::string history;
    std::string output;
    bool overwrite = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "report", "Turn results files into one self-contained HTML report (or Markdown / CSV)");
  sub->add_option("results", flags->inputs, "Results files (dlprobe.results/1), merged in order");
  sub->add_option("--history", flags->history,
                  "Also report the latest result of each configuration on each machine, GPU, "
                  "driver and CUDA of this history database (e.g. a fleet's, from history import)");
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
    if (flags->inputs.empty() && flags->history.empty()) {
      return report_error(invalid_argument("report: name results files, or --history FILE"));
    }
    std::vector<NamedOutput> read = {{"--history", flags->history}};
    for (const std::string& input : flags->inputs) read.push_back({"the results file", input});
    if (Status s = prepare_outputs({{"-o", flags->output}}, flags->overwrite, read); !s) {
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
    if (!flags->history.empty()) {
      auto stored = latest_from_history(flags->history);
      if (!stored) return report_error(stored.status());
      for (auto& d : *stored) documents.push_back(std::move(d));
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
