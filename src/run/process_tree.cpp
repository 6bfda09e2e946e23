#include "dlprobe/run/process_tree.h"
#include "dlprobe/core/clock.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>

namespace dlprobe::run {

namespace {

template <class T>
bool parse_number(std::string_view text, T& out) {
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end;
}

std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

}  // namespace

Result<ProcStat> parse_proc_stat(std::string_view line) {
  const auto open = line.find('(');
  const auto close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return error(Errc::invalid_argument, "proc stat: no '(comm)' field");
  }
  ProcStat s;
  if (!parse_number(line.substr(0, open > 0 ? open - 1 : 0), s.pid)) {
    return error(Errc::invalid_argument, "proc stat: bad pid");
  }
  s.comm = std::string(line.substr(open + 1, close - open - 1));
  // Fields after comm, numbered as in proc(5): 3 state, 4 ppid, 5 pgrp, 14 utime, 15 stime,
  // 16 cutime, 17 cstime, 22 starttime.
  std::vector<std::string_view> fields;
  std::string_view rest = line.substr(close + 1);
  while (!rest.empty()) {
    const auto start = rest.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    rest = rest.substr(start);
    const auto end = rest.find(' ');
    fields.push_back(rest.substr(0, end));
    if (end == std::string_view::npos) break;
    rest = rest.substr(end);
  }
  constexpr std::size_t kFirst = 3;  // proc(5) number of fields[0]
  auto field = [&](std::size_t number) { return fields[number - kFirst]; };
  if (fields.size() < 22 - kFirst + 1 || field(3).size() != 1) {
    return error(Errc::invalid_argument, "proc stat: too few fields");
  }
  s.state = field(3)[0];
  // cutime and cstime are signed in the kernel's format; a negative value never occurs in practice
  // but must not wrap, so they are read as signed and clamped.
  std::int64_t cutime = 0;
  std::int64_t cstime = 0;
  if (!parse_number(field(4), s.ppid) || !parse_number(field(5), s.pgid) ||
      !parse_number(field(14), s.utime) || !parse_number(field(15), s.stime) ||
      !parse_number(field(16), cutime) || !parse_number(field(17), cstime) ||
      !parse_number(field(22), s.starttime)) {
    return error(Errc::invalid_argument, "proc stat: a numeric field does not parse");
  }
  s.cutime = static_cast<std::uint64_t>(std::max<std::int64_t>(cutime, 0));
  s.cstime = static_cast<std::uint64_t>(std::max<std::int64_t>(cstime, 0));
  return s;
}

std::vector<ProcStat> scan_processes(const std::string& proc_root) {
  std::vector<ProcStat> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    int pid = 0;
    if (!parse_number(std::string_view(name), pid)) continue;
    auto line = read_first_line(entry.path().string() + "/stat");
    if (!line) continue;
    if (auto stat = parse_proc_stat(*line)) out.push_back(std::move(stat).value());
  }
  return out;
}

std::optional<std::uint64_t> read_rss_bytes(int pid, const std::string& proc_root) {
  std::ifstream in(fmt::format("{}/{}/statm", proc_root, pid));
  std::uint64_t size_pages = 0;
  std::uint64_t resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return std::nullopt;
  return resident_pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

std::vector<int> tree_pids(const std::vector<ProcStat>& all, const std::vector<int>& roots,
                           int pgid) {
  std::multimap<int, int> children;  // ppid -> pid
  std::set<int> present;
  std::set<int> members;
  for (const auto& p : all) {
    children.emplace(p.ppid, p.pid);
    present.insert(p.pid);
    if (pgid > 0 && p.pgid == pgid) members.insert(p.pid);
  }
  // Group members' own children belong too, even when they left the group (setsid).
  std::vector<int> stack(members.begin(), members.end());
  for (int root : roots) {
    if (present.count(root) != 0) members.insert(root);
    stack.push_back(root);
  }
  while (!stack.empty()) {
    const int pid = stack.back();
    stack.pop_back();
    auto [begin, end] = children.equal_range(pid);
    for (auto it = begin; it != end; ++it) {
      if (members.insert(it->second).second) stack.push_back(it->second);
    }
  }
  return {members.begin(), members.end()};
}

TreeTracker::TreeTracker(std::vector<int> roots, int pgid, std::vector<int> exclude,
                         std::string proc_root)
    : roots_(std::move(roots)),
      pgid_(pgid),
      exclude_(std::move(exclude)),
      proc_root_(std::move(proc_root)) {
  if (const long ticks = sysconf(_SC_CLK_TCK); ticks > 0) ticks_per_s_ = static_cast<double>(ticks);
}

TreeReading TreeTracker::poll() {
  TreeReading reading;
  reading.timestamp_ns = steady_now_ns();
  const auto all = scan_processes(proc_root_);
  std::vector<int> pids = tree_pids(all, roots_, pgid_);
  std::erase_if(pids, [&](int pid) {
    return std::find(exclude_.begin(), exclude_.end(), pid) != exclude_.end();
  });
  std::map<int, const ProcStat*> by_pid;
  for (const auto& p : all) by_pid[p.pid] = &p;

  // A process's time since the last poll is its own ticks' growth plus its reaped children's
  // (cutime and cstime) growth. A child this tracker already saw brings all its time to its
  // parent's cutime when it is reaped, and the part seen before was counted then: it is taken off
  // the parent's growth, so that each tick counts once (a child that started and ended between
  // two polls is counted through its parent alone).
  // A child whose parent is gone too was reaped by that parent before the parent's own parent
  // reaped it, so the ticks pass up to the nearest ancestor still here.
  std::map<int, std::uint64_t> counted_of_reaped;  // by the ancestor that holds them now
  const auto gone = [&](int pid) { return last_.count(pid) != 0 && by_pid.count(pid) == 0; };
  for (const auto& [pid, was] : last_) {
    if (!gone(pid)) continue;
    int holder = was.ppid;
    for (std::size_t hops = 0; gone(holder) && hops < last_.size(); ++hops) {
      holder = last_.at(holder).ppid;
    }
    counted_of_reaped[holder] += was.own_ticks + was.children_ticks;
  }
  std::map<int, Seen> seen;
  double total_ticks = 0;
  double busiest_ticks = 0;
  for (int pid : pids) {
    const ProcStat& p = *by_pid.at(pid);
    const Seen now{p.starttime, p.ppid, p.utime + p.stime, p.cutime + p.cstime};
    seen[pid] = now;
    // A process new since the last poll (or a reused pid) spent all its ticks in this interval.
    std::uint64_t own = now.own_ticks;
    std::uint64_t children = now.children_ticks;
    if (auto it = last_.find(pid); it != last_.end() && it->second.starttime == p.starttime) {
      own = own >= it->second.own_ticks ? own - it->second.own_ticks : 0;
      children = children >= it->second.children_ticks ? children - it->second.children_ticks : 0;
    }
    const std::uint64_t counted = counted_of_reaped[pid];
    const std::uint64_t delta = own + (children > counted ? children - counted : 0);
    total_ticks += static_cast<double>(delta);
    busiest_ticks = std::max(busiest_ticks, static_cast<double>(delta));
    if (auto rss = read_rss_bytes(pid, proc_root_)) reading.rss_bytes += *rss;
  }
  if (last_ns_ && reading.timestamp_ns > *last_ns_) {
    const double seconds = static_cast<double>(reading.timestamp_ns - *last_ns_) / 1e9;
    reading.cpu_pct = 100.0 * total_ticks / ticks_per_s_ / seconds;
    reading.busiest_cpu_pct = 100.0 * busiest_ticks / ticks_per_s_ / seconds;
  }
  last_ = std::move(seen);
  last_ns_ = reading.timestamp_ns;
  reading.pids = std::move(pids);
  return reading;
}

}  // namespace dlprobe::run
