#include "dlprobe/bench/outputs.h"

#include <filesystem>
#include <span>
#include <system_error>
#include <vector>

#include "dlprobe/core/files.h"
#include "dlprobe/results/table.h"

namespace dlprobe::bench {

Result<Outputs> Outputs::create(std::string json, std::string csv, std::string md,
                                results::Context context) {
  Outputs o;
  o.json_ = std::move(json);
  o.csv_ = std::move(csv);
  o.md_ = std::move(md);
  o.document_.context = std::move(context);
  // A file that exists is left as it is until the first configuration replaces it (the command
  // has checked that it can be), so that a run that fails before measuring keeps what it held;
  // the files this call creates are removed again if a later output fails, so that such a run
  // leaves none behind either. (A link to nothing is not removed: the link is the user's.)
  const Contents contents = o.contents();
  std::vector<std::string> created;
  for (const auto& [path, content] : contents) {
    if (path->empty() || is_stdout_path(*path)) continue;
    std::error_code ec;
    if (std::filesystem::is_regular_file(*path, ec)) continue;
    const bool is_new = !std::filesystem::exists(std::filesystem::symlink_status(*path, ec));
    if (Status s = write_file_atomic(*path, content); !s) {
      for (const std::string& c : created) std::filesystem::remove(c, ec);
      return s;
    }
    if (is_new) created.push_back(*path);
  }
  return o;
}

Status Outputs::write(const std::vector<results::Configuration>& configurations) {
  document_.configurations = configurations;
  return flush();
}

Status Outputs::add_findings(const std::vector<results::Finding>& findings) {
  document_.findings.insert(document_.findings.end(), findings.begin(), findings.end());
  return flush();
}

Status Outputs::finish() const {
  return flush(true);
}

Outputs::Contents Outputs::contents() const {
  Contents out;
  const auto asked = [](const std::string& path) { return !path.empty(); };
  if (asked(json_)) out.emplace_back(&json_, results::serialize(document_));
  if (asked(csv_) || asked(md_)) {
    const results::NamedDocument named{"results", document_};
    const results::Table table = results::configuration_table(std::span(&named, 1));
    if (asked(csv_)) out.emplace_back(&csv_, results::to_csv(table));
    if (asked(md_)) out.emplace_back(&md_, results::to_markdown(table));
  }
  return out;
}

Status Outputs::flush(bool last) const {
  // A file is rewritten every time; standard output, which cannot be, only the last time.
  for (const auto& [path, content] : contents()) {
    if (last ? is_stdout_path(*path) : !is_stdout_path(*path)) {
      DLPROBE_RETURN_IF_ERROR(write_file_atomic(*path, content));
    }
  }
  return Status::ok();
}

}  // namespace dlprobe::bench
