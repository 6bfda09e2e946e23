#include "dlprobe/core/launcher.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>

namespace dlprobe {

namespace {

// The variables one launcher sets.
struct LauncherVars {
  Launcher launcher;
  std::string_view rank;
  std::string_view size;
  std::string_view local_rank;
};
constexpr std::array<LauncherVars, 4> kLaunchers{{
    {Launcher::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {Launcher::openmpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {Launcher::mpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {Launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
}};

Result<int> env_int(const EnvLookup& env, std::string_view name, std::string_view launcher) {
  auto value = env(name);
  if (!value) return invalid_argument(fmt::format("{} is not set ({})", name, launcher));
  int out = 0;
  const char* end = value->data() + value->size();
  auto [ptr, ec] = std::from_chars(value->data(), end, out);
  if (value->empty() || ec != std::errc() || ptr != end)
    return invalid_argument(fmt::format("{}='{}' is not an integer ({})", name, *value, launcher));
  return out;
}

bool non_empty(const EnvLookup& env, std::string_view name) {
  auto v = env(name);
  return v && !v->empty();
}

}  // namespace

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::none:
      return "none";
    case Launcher::torchrun:
      return "torchrun";
    case Launcher::openmpi:
      return "Open MPI";
    case Launcher::mpich:
      return "MPICH/PMI";
    case Launcher::slurm:
      return "Slurm";
  }
  return "none";
}

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup map_env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](std::string_view name) -> std::optional<std::string> {
    auto it = values.find(std::string(name));
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

std::string first_slurm_host(std::string_view nodelist) {
  // Slurm's compressed form: prefix[ranges],other... The first host is the prefix followed by the
  // first number of the first range, with its zero padding kept.
  std::string host;
  for (std::size_t i = 0; i < nodelist.size(); ++i) {
    const char c = nodelist[i];
    if (c == ',') break;
    if (c != '[') {
      host += c;
      continue;
    }
    std::size_t j = i + 1;
    while (j < nodelist.size() && std::isdigit(static_cast<unsigned char>(nodelist[j]))) ++j;
    if (j == i + 1 || j >= nodelist.size() ||
        (nodelist[j] != '-' && nodelist[j] != ',' && nodelist[j] != ']'))
      return {};
    host.append(nodelist.substr(i + 1, j - i - 1));
    const auto close = nodelist.find(']', j);
    if (close == std::string_view::npos) return {};
    i = close;
  }
  return host;
}

Result<RankEnv> read_rank_env(const EnvLookup& env) {
  RankEnv out;
  const LauncherVars* found = nullptr;
  for (const auto& vars : kLaunchers) {
    if (env(vars.rank) || env(vars.size)) {
      found = &vars;
      break;
    }
  }
  if (found == nullptr) return out;
  out.launcher = found->launcher;
  const std::string_view name = launcher_name(found->launcher);
  auto rank = env_int(env, found->rank, name);
  if (!rank) return rank.status();
  auto size = env_int(env, found->size, name);
  if (!size) return size.status();
  auto local = env_int(env, found->local_rank, name);
  if (!local) return local.status();
  if (*size < 1)
    return invalid_argument(
        fmt::format("{}={}: the world needs at least one rank ({})", found->size, *size, name));
  if (*rank < 0 || *rank >= *size)
    return invalid_argument(fmt::format("{}={} is outside 0..{} ({}={}, {})", found->rank, *rank,
                                        *size - 1, found->size, *size, name));
  if (*local < 0 || *local >= *size)
    return invalid_argument(fmt::format("{}={} is outside 0..{} ({}={}, {})", found->local_rank,
                                        *local, *size - 1, found->size, *size, name));
  out.rank = *rank;
  out.world_size = *size;
  out.local_rank = *local;

  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    out.master_addr = *addr;
  } else if (found->launcher == Launcher::slurm) {
    if (auto list = env("SLURM_STEP_NODELIST"); list && !list->empty()) {
      out.master_addr = first_slurm_host(*list);
      if (out.master_addr.empty())
        return invalid_argument(
            fmt::format("SLURM_STEP_NODELIST='{}' is not a Slurm host list", *list));
    } else if (non_empty(env, "SLURM_LAUNCH_NODE_IPADDR")) {
      out.master_addr = *env("SLURM_LAUNCH_NODE_IPADDR");
    }
  }
  if (env("MASTER_PORT")) {
    auto port = env_int(env, "MASTER_PORT", name);
    if (!port) return port.status();
    if (*port < 1 || *port > 65535)
      return invalid_argument(fmt::format("MASTER_PORT={} is not a TCP port (1-65535)", *port));
    out.master_port = *port;
  }
  if (out.world_size > 1 && out.master_addr.empty()) {
    return invalid_argument(fmt::format(
        "{}={} ranks under {} but nothing names rank 0's host: set MASTER_ADDR{}", found->size,
        out.world_size, name,
        found->launcher == Launcher::slurm ? " (or run inside a step: SLURM_STEP_NODELIST)" : ""));
  }
  return out;
}

Result<int> nccl_bootstrap_port(const RankEnv& rank, const EnvLookup& env) {
  if (env("DLPROBE_NCCL_PORT")) {
    auto port = env_int(env, "DLPROBE_NCCL_PORT", "dlprobe");
    if (!port) return port.status();
    if (*port < 1 || *port > 65535)
      return invalid_argument(
          fmt::format("DLPROBE_NCCL_PORT={} is not a TCP port (1-65535)", *port));
    return *port;
  }
  if (rank.master_port) {
    if (*rank.master_port == 65535)
      return invalid_argument(
          "MASTER_PORT=65535 leaves no port above it for NCCL's bootstrap: "
          "set DLPROBE_NCCL_PORT");
    return *rank.master_port + 1;
  }
  if (auto job = env("SLURM_JOB_ID"); job && !job->empty()) {
    auto id = env_int(env, "SLURM_JOB_ID", "Slurm");
    if (!id) return id.status();
    return 15000 + *id % 10000;
  }
  return kDefaultNcclPort;
}

Result<std::string> nccl_comm_id(const RankEnv& rank, const EnvLookup& env) {
  if (auto set = env("NCCL_COMM_ID"); set && !set->empty()) {
    if (set->find(':') == std::string::npos)
      return invalid_argument(fmt::format("NCCL_COMM_ID='{}' is not <address>:<port>", *set));
    return *set;
  }
  std::string addr = rank.master_addr;
  if (addr.empty()) {
    if (rank.world_size > 1)
      return invalid_argument(
          fmt::format("{} ranks but no address for rank 0: set MASTER_ADDR", rank.world_size));
    addr = "127.0.0.1";
  }
  auto port = nccl_bootstrap_port(rank, env);
  if (!port) return port.status();
  // NCCL reads an IPv6 address in brackets, as in a URL.
  if (addr.find(':') != std::string::npos && addr.front() != '[') addr = "[" + addr + "]";
  return fmt::format("{}:{}", addr, *port);
}

std::map<std::string, std::string> nccl_child_env(const EnvLookup& env) {
  if (env(kNvlsVariable)) return {};
  return {{std::string(kNvlsVariable), "0"}};
}

bool disable_nvls_in_process() {
  // overwrite = 0: a value the user set stands.
  const std::string name(kNvlsVariable);
  if (std::getenv(name.c_str()) != nullptr) return false;
  return setenv(name.c_str(), "0", 0) == 0;
}

}  // namespace dlprobe
