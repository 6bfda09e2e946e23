// dlprobe's command line: one subcommand per job. Results go to stdout, progress and errors to
// stderr; bad input ends with a one-line error and exit code 2.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "commands.h"
#include "dlprobe/core/build_info.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"

namespace {

// Whether standard output is a pipe whose reading end is closed (poll says POLLERR then).
bool reader_gone() {
  pollfd out{STDOUT_FILENO, POLLOUT, 0};
  return poll(&out, 1, 0) == 1 && (out.revents & POLLERR) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dlprobe::cli;
  // Past the file-size limit (ulimit -f) a write fails with EFBIG, which the writers report and
  // clean up after, rather than SIGXFSZ ending the process with nothing said.
  std::signal(SIGXFSZ, SIG_IGN);
  const auto& build = dlprobe::build_info();
  CLI::App app{"dlprobe: how fast and how big a deep-learning workload is on this GPU and stack"};
  app.set_version_flag("--version", fmt::format("dlprobe {} ({})", build.version, build.git_hash));
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log debug detail to stderr");

  const std::vector<Command> commands = {
      add_evaluate_command(app), add_doctor_command(app),  add_monitor_command(app),
      add_bench_command(app),    add_memory_command(app),  add_step_command(app),
      add_run_command(app),      add_report_command(app),  add_compare_command(app),
      add_pipeline_command(app), add_history_command(app),
  };
  name_value_types(app);
  // -v is the top-level's, yet a user writes it where the other options are: `dlprobe bench -v`.
  // Not a nested command's (pipeline's options would pass to make-dataset), and not run's, whose
  // workload after its name may take a -v of its own (`dlprobe run python3 train.py -v`).
  for (const auto& command : commands) {
    if (command.app->get_name() != "run") command.app->fallthrough();
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {
      std::fprintf(stderr, "dlprobe: error: %s (see --help)\n",
                   dlprobe::one_line(e.what()).c_str());
      return kExitError;
    }
    return app.exit(e);
  }
  if (const dlprobe::Status s = refuse_empty_values(app); !s.is_ok()) return report_error(s);
  if (verbose) dlprobe::log_set_level(dlprobe::LogLevel::debug);
  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    int code = kExitError;
    // The last resort for what the library does not turn into a Status (a thread the system would
    // not start, memory it would not give): one line and exit code 2 rather than an abort.
    try {
      code = command.run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dlprobe: error: %s\n", dlprobe::one_line(e.what()).c_str());
      return kExitError;
    }
    // What a command prints on standard output is its result too (compare's verdicts, doctor's
    // report, the tables): a write there that failed, as on a full disk, must not end in success.
    // A command that failed has said why in its one line already.
    // A reader that went away (`| head -1`) took what it wanted: that is the user's choice, and
    // the results files hold the rest.
    const bool flushed = std::fflush(stdout) == 0;
    const int flush_errno = errno;
    if (code != kExitError && (!flushed || std::ferror(stdout) != 0) && !reader_gone()) {
      // errno belongs to the flush only when the flush failed; an earlier write's is gone.
      std::fprintf(stderr, "dlprobe: error: standard output: cannot write: %s\n",
                   flushed ? "an earlier write failed" : std::strerror(flush_errno));
      return kExitError;
    }
    return code;
  }
  return kExitError;
}
