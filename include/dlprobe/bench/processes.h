// bench --repeat-process N: the whole measurement run N times, each in a fresh process (the
// command re-executed without the flag, writing a results file of its own), and the processes'
// files merged into one, whose runs are the processes. A fresh process starts anew what fresh
// engines in one process share: the loader, the allocator's address space, the threads'
// placement, the libraries' one-time choices. docs/bench.md.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/results/results.h"

namespace dlprobe::bench {

// One of the processes: its results file as read, or why there is none.
struct ProcessRun {
  std::optional<results::Document> document;
  // How it ended when that was not well ("exit 3", "signal 11 (SIGSEGV)", "no results file: …");
  // empty when it exited 0.
  std::string failure;
};

// The arguments of one process: this command line's (`own`, argv[0] first), less
// --repeat-process and what the parent alone writes (--json, --csv, --md, --history, --overwrite,
// --no-history, -q), in either form ("--json F", "--json=F"), then the process's own results file,
// --quiet and --no-history.
std::vector<std::string> process_arguments(const std::vector<std::string>& own,
                                           const std::string& results);

// Runs the command line `own` `count` times, each in a fresh process of this executable
// (/proc/self/exe) writing its results into a temporary folder, which is removed afterwards.
// `starting(i)` is asked before process i (from 0) and stops the series when false (Ctrl-C). A
// process that fails is a ProcessRun with its failure; an error only when none can be started.
Result<std::vector<ProcessRun>> run_processes(const std::vector<std::string>& own, int count,
                                              const std::function<bool(int)>& starting);

// The processes' results as one document. The context is the first document's. A configuration
// (matched across the documents by its settings, in the first document's order) holds the timed
// steps of every process that measured it, one run per process (samples.run_steps, runs_in
// processes; a process's own --repeat runs count as one), statistics over them all and, from two
// processes on, the spread between them (run_spread); memory, telemetry and compute come from the
// first process that measured it, compute's achieved TFLOP/s from the merged throughput. Findings:
// bench's rules over the merged numbers, then each process's own that are not already said. A
// configuration no process measured is the first document's as it is. A process that failed keeps
// the others' results and is a warning of the document (id process_failed).
results::Document merge_processes(const std::vector<ProcessRun>& processes);

// What the terminal shows after the processes: each configuration's throughput over all of them
// with its interval within the steps, each process's throughput and the interval between them,
// and the processes that failed.
std::string processes_text(const results::Document& merged,
                           const std::vector<ProcessRun>& processes);

}  // namespace dlprobe::bench
