// The throughput forms `dlprobe run` reads from a workload's output without a --throughput-regex
// (run::match_printed_figure: Keras progress bars, tqdm, tf_cnn_benchmarks, the Hugging Face
// Trainer, "Throughput: …"). The input is split into lines at '\n' and '\r' as the workload's
// pipe is, and each line, then the whole input as one line, is matched. A figure names a known
// form, of the kind that form prints, and only the closing forms are summaries.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "dlprobe/run/workload_output.h"

namespace {

using dlprobe::run::PrintedFigure;
using Kind = PrintedFigure::Kind;

// Whether the figure is one the form named by `format` gives.
bool consistent(const PrintedFigure& f) {
  const std::string_view form = f.format;
  if (form == "throughput" || form == "hf_trainer") return f.kind == Kind::items_per_s && f.summary;
  if (form == "average_step_time") return f.kind == Kind::step_time_s && f.summary;
  if (form == "tf_cnn_benchmarks") return f.kind == Kind::items_per_s;
  if (form == "batch_size") return f.kind == Kind::batch && !f.summary;
  if (form == "keras") return f.kind == Kind::step_time_s && !f.summary;
  if (form == "tqdm") {
    return (f.kind == Kind::steps_per_s || f.kind == Kind::step_time_s) && !f.summary;
  }
  return false;
}

void check(std::string_view line) {
  const std::optional<PrintedFigure> f = dlprobe::run::match_printed_figure(line);
  if (f && !consistent(*f)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n' || text[i] == '\r') {
      check(text.substr(start, i - start));
      start = i + 1;
    }
  }
  check(text);
  return 0;
}
