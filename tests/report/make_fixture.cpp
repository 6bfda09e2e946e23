// Writes the SYNTHETIC TEST FIXTURE results files into a folder:
//   make_report_fixture tests/report/fixtures
#include <cstdio>
#include <filesystem>

#include "dlprobe/core/files.h"
#include "dlprobe/results/results.h"
#include "fixture.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  const std::filesystem::path folder(argv[1]);
  using namespace dlprobe;
  for (const auto& [name, document] :
       {std::pair{"synthetic_native.json", testing::synthetic_native_document()},
        std::pair{"synthetic_external.json", testing::synthetic_external_document()}}) {
    if (auto s = write_file_atomic(folder / name, results::serialize(document)); !s) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
  }
  return 0;
}
