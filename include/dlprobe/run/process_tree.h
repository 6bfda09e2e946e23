// Following a workload's processes through /proc: which pids belong to it (descendants by ppid,
// plus everything in its process group, so a daemonised helper that re-parented itself is still
// counted) and what they cost the host (CPU time, resident memory).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe::run {

// The fields of /proc/<pid>/stat that tree tracking needs.
struct ProcStat {
  int pid = 0;
  std::string comm;
  char state = '?';
  int ppid = 0;
  int pgid = 0;
  // Clock ticks (sysconf(_SC_CLK_TCK)); the c* fields hold reaped children's time, which keeps the
  // tree's total monotonic when a child exits and its parent, also in the tree, waits for it.
  std::uint64_t utime = 0;
  std::uint64_t stime = 0;
  std::uint64_t cutime = 0;
  std::uint64_t cstime = 0;
  std::uint64_t starttime = 0;  // ticks after boot; with pid it names a process across pid reuse
};

// Parses one /proc/<pid>/stat line. comm may hold spaces and ')' so it ends at the last ')'.
Result<ProcStat> parse_proc_stat(std::string_view line);

// Every process under `proc_root` whose stat can be read (processes vanish while we look).
std::vector<ProcStat> scan_processes(const std::string& proc_root = "/proc");

// Resident set size from /proc/<pid>/statm (pages times the page size), nullopt when it is gone.
std::optional<std::uint64_t> read_rss_bytes(int pid, const std::string& proc_root = "/proc");

// The pids of `all` that descend from one of `roots` (by ppid chains) or are in process group
// `pgid` (0: none), sorted. The roots themselves are included when present.
std::vector<int> tree_pids(const std::vector<ProcStat>& all, const std::vector<int>& roots,
                           int pgid);

// Host cost of the tree at one instant.
struct TreeReading {
  std::int64_t timestamp_ns = 0;  // steady clock
  std::vector<int> pids;
  // CPU use since the previous reading, in percent of one core (as `top` shows it), summed over
  // the tree, and of its busiest process; nullopt on the first reading.
  std::optional<double> cpu_pct;
  std::optional<double> busiest_cpu_pct;
  std::uint64_t rss_bytes = 0;  // summed over the tree (shared pages count once per process)
};

// Polled by the runner every sampling interval.
class TreeTracker {
 public:
  // `roots`: the workload's pid (and, with a child subreaper, our own pid: orphans come to us).
  // `exclude`: pids never counted (ourselves).
  TreeTracker(std::vector<int> roots, int pgid, std::vector<int> exclude,
              std::string proc_root = "/proc");
  TreeReading poll();

 private:
  struct Seen {
    std::uint64_t starttime = 0;
    int ppid = 0;
    std::uint64_t own_ticks = 0;       // utime + stime
    std::uint64_t children_ticks = 0;  // cutime + cstime: its children reaped so far
  };
  std::vector<int> roots_;
  int pgid_ = 0;
  std::vector<int> exclude_;
  std::string proc_root_;
  std::map<int, Seen> last_;
  std::optional<std::int64_t> last_ns_;
  double ticks_per_s_ = 100.0;
};

}  // namespace dlprobe::run
