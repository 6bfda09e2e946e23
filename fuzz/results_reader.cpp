// The results reader (results::parse): any bytes give a document or an error that says why, and a
// document it accepts writes out and reads back as itself.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dlprobe/results/results.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto document = dlprobe::results::parse(text, "fuzz");
  if (!document) {
    if (document.status().message().empty()) std::abort();
    return 0;
  }
  auto again = dlprobe::results::parse(dlprobe::results::serialize(*document), "again");
  if (!again || !(*again == *document)) std::abort();
  return 0;
}
