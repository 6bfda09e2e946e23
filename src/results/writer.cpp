#include "dlprobe/results/writer.h"

#include "dlprobe/core/files.h"

namespace dlprobe::results {

Result<ResultsWriter> ResultsWriter::create(std::filesystem::path path, Context context) {
  Document document;
  document.context = std::move(context);
  ResultsWriter writer(std::move(path), std::move(document));
  DLPROBE_RETURN_IF_ERROR(writer.flush());
  return writer;
}

Status ResultsWriter::add(Configuration configuration) {
  document_.configurations.push_back(std::move(configuration));
  return flush();
}

Status ResultsWriter::add_finding(Finding finding) {
  document_.findings.push_back(std::move(finding));
  return flush();
}

Status ResultsWriter::finish() const {
  return is_stdout_path(path_) ? write_file_atomic(path_, serialize(document_)) : Status::ok();
}

Status ResultsWriter::flush() const {
  if (is_stdout_path(path_)) return Status::ok();
  return write_file_atomic(path_, serialize(document_));
}

}  // namespace dlprobe::results
