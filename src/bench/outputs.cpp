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
  // leaves none behind either.
  std::vector<std::string> created;
  for (const std::string* path : {&o.json_, &o.csv_, &o.md_}) {
    if (path->empty() || is_stdout_path(*path)) continue;
    std::error_code ec;
    if (std::filesystem::is_regular_file(*path, ec)) continue;
    const bool is_new = !std::filesystem::exists(*path, ec);
    if (Status s = o.write_one(*path); !s) {
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

Status Outputs::flush(bool last) const {
  // A file is rewritten every time; standard output, which cannot be, only the last time.
  for (const std::string* path : {&json_, &csv_, &md_}) {
    if (!path->empty() && (last ? is_stdout_path(*path) : !is_stdout_path(*path))) {
      DLPROBE_RETURN_IF_ERROR(write_one(*path));
    }
  }
  return Status::ok();
}

Status Outputs::write_one(const std::string& path) const {
  if (&path == &json_) return write_file_atomic(path, results::serialize(document_));
  const results::NamedDocument named{"results", document_};
  const results::Table table = results::configuration_table(std::span(&named, 1));
  return write_file_atomic(path,
                           &path == &csv_ ? results::to_csv(table) : results::to_markdown(table));
}

}  // namespace dlprobe::bench
