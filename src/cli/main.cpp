// dlprobe's command line: one subcommand per job. Results go to stdout, progress and errors to
// stderr; bad input ends with a one-line error and exit code 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dlprobe/build_info.h"
#include "dlprobe/log.h"

int main(int argc, char** argv) {
  const auto& build = dlprobe::build_info();
  CLI::App app{"dlprobe: how fast and how big a deep-learning workload is on this GPU and stack"};
  app.set_version_flag("--version", fmt::format("dlprobe {} ({})", build.version, build.git_hash));
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log debug detail to stderr");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (verbose) dlprobe::log_set_level(dlprobe::LogLevel::debug);
  return 0;
}
