// Environment variables dlprobe sets in its own process for its own GPU work, unless the user's
// environment already has them (the user's value stands). Workloads started through
// run::ChildProcess (`run`'s) get the user's environment as it was given, without these: what
// suits dlprobe's own step need not suit theirs, and a measurement of their script must not
// change it. The commands that set one (bench and evaluate with --data) start no such workload;
// the guard keeps a library caller that does both from passing dlprobe's settings on.
#pragma once

#include <string_view>

namespace dlprobe {

// Sets name=value in this process unless the environment has name; returns whether it set it.
// Call before any thread that reads the environment starts.
bool set_default_env(std::string_view name, std::string_view value);

// Whether set_default_env set name in this process (children started by dlprobe go without it).
bool set_by_dlprobe(std::string_view name);

}  // namespace dlprobe
