// Read by hand: procps' libproc2 has no stable API for the two numbers needed here, and each is one
// line of /proc in a format the kernel keeps (proc(5)).
#include "dlprobe/bench/host_cpu.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace dlprobe::bench {

namespace {

std::string read_all(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

double ticks_per_second() {
  const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? static_cast<double>(ticks) : 100.0;
}

}  // namespace

std::optional<double> parse_proc_stat_busy(std::string_view text, double ticks) {
  if (!text.starts_with("cpu ")) return std::nullopt;
  std::istringstream line{std::string(text.substr(4, text.find('\n')))};
  // user nice system idle iowait irq softirq steal
  double v[8] = {};
  for (double& x : v) {
    if (!(line >> x)) return std::nullopt;
  }
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / ticks;
}

std::optional<double> parse_proc_pid_cpu(std::string_view text, double ticks) {
  // The command name (field 2) is in parentheses and may hold spaces and ')': the fields are
  // counted from the last ')'. utime and stime are fields 14 and 15, the 11th and 12th after it.
  const auto close = text.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::istringstream rest{std::string(text.substr(close + 1))};
  std::string field;
  double utime = 0;
  double stime = 0;
  for (int i = 3; i <= 13; ++i) {
    if (!(rest >> field)) return std::nullopt;
  }
  if (!(rest >> utime >> stime)) return std::nullopt;
  return (utime + stime) / ticks;
}

std::optional<CpuTimes> read_cpu_times() {
  const double ticks = ticks_per_second();
  const std::optional<double> all = parse_proc_stat_busy(read_all("/proc/stat"), ticks);
  const std::optional<double> own = parse_proc_pid_cpu(read_all("/proc/self/stat"), ticks);
  if (!all || !own) return std::nullopt;
  return CpuTimes{*all, *own};
}

double other_cpu_seconds(const CpuTimes& begin, const CpuTimes& end) {
  return std::max(
      0.0, (end.all_busy_seconds - begin.all_busy_seconds) - (end.own_seconds - begin.own_seconds));
}

int online_cpus() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace dlprobe::bench
