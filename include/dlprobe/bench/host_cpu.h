// Other processes' use of the host's CPUs during a timed window, from /proc: what every process
// together used (/proc/stat's "cpu" line) less what this process used (/proc/self/stat). A CPU
// benchmark shares its cores with them, and a GPU benchmark the thread that feeds the GPU, so a
// window under load is slower for reasons that are not the workload's.
#pragma once

#include <optional>
#include <string_view>

namespace dlprobe::bench {

struct CpuTimes {
  double all_busy_seconds = 0;  // every CPU's time not idle, since boot
  double own_seconds = 0;       // this process's user and system time, every thread's
};

// /proc/stat's text: the busy time of the first ("cpu") line (user, nice, system, irq, softirq,
// steal; guest time is inside user) in seconds; nullopt when the line is not there.
std::optional<double> parse_proc_stat_busy(std::string_view text, double ticks_per_second);
// /proc/<pid>/stat's text: utime + stime in seconds; nullopt when malformed.
std::optional<double> parse_proc_pid_cpu(std::string_view text, double ticks_per_second);

// Now, on this machine; nullopt where /proc cannot be read.
std::optional<CpuTimes> read_cpu_times();
// The CPU seconds other processes used between `begin` and `end` (never below 0: the two files
// are read a moment apart, in ticks).
double other_cpu_seconds(const CpuTimes& begin, const CpuTimes& end);
// The CPUs online now.
int online_cpus();

}  // namespace dlprobe::bench
