// What `dlprobe run` reads from a workload's output (run/workload_output.h): the line protocol,
// the out-of-memory and error detectors, and, where the input has a first line, that line as a
// --throughput-regex matched against the rest. Nothing may crash, hang or throw.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dlprobe/run/workload_output.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dlprobe::run;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto record = parse_protocol_line(text); !record) {
    if (record.status().message().empty()) std::abort();
  }
  (void)detect_oom(text);
  (void)looks_like_error(text);
  const std::size_t newline = text.find('\n');
  if (newline != std::string_view::npos) {
    if (auto regex = ThroughputRegex::compile(text.substr(0, newline))) {
      (void)regex->match(text.substr(newline + 1));
    }
  }
  return 0;
}
