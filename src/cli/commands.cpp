#include "commands.h"

#include <cstdio>

namespace dlprobe::cli {

int report_error(const Status& status) {
  std::fprintf(stderr, "dlprobe: error: %s\n", status.message().c_str());
  return kExitError;
}

}  // namespace dlprobe::cli
