// The rank of this process as a launcher gives it (torchrun, Open MPI, MPICH/PMI, Slurm), read
// from the environment the launcher sets, and what NCCL needs from it: the address rank 0 listens
// on (NCCL_COMM_ID), so every rank's ncclGetUniqueId yields the same id without a rendezvous
// server of dlprobe's own; and NVLink multicast (NVLS) kept off in dlprobe and its workloads.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "dlprobe/core/status.h"

namespace dlprobe {

enum class Launcher { none, torchrun, openmpi, mpich, slurm };
std::string_view launcher_name(Launcher launcher);  // "none", "torchrun", "Open MPI", ...

struct RankEnv {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // the GPU this rank uses among the node's visible ones
  // Where rank 0 runs, for NCCL's bootstrap; empty when nothing names it (allowed for one rank).
  std::string master_addr;
  std::optional<int> master_port;
};

// Reads one variable; nullopt when unset. Tests pass a map, dlprobe the process environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup process_env();
EnvLookup map_env(std::map<std::string, std::string> values);

// The first launcher whose variables are present decides, in this order: torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK), MPICH/PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID). The order puts the launcher nearest the process first: torchrun
// or mpirun started inside a Slurm allocation sees the allocation's SLURM_* too. Under the MPI
// launchers MASTER_ADDR/MASTER_PORT name rank 0's host when set; under Slurm MASTER_ADDR, else the
// first host of SLURM_STEP_NODELIST, else SLURM_LAUNCH_NODE_IPADDR. No launcher: one rank.
// Fails with one line naming the variable on a value that is not an integer, a rank outside the
// world, a half-set launcher, or several ranks with no address for rank 0.
Result<RankEnv> read_rank_env(const EnvLookup& env);

// The first host of a Slurm host list: "gpu[01-04,07],cpu1" -> "gpu01"; empty when unparsable.
std::string first_slurm_host(std::string_view nodelist);

// The port NCCL's bootstrap listens on at rank 0: DLPROBE_NCCL_PORT, else MASTER_PORT + 1
// (torchrun's store holds MASTER_PORT itself), else 15000 + the last four digits of SLURM_JOB_ID
// (so two jobs sharing a node differ), else kDefaultNcclPort.
inline constexpr int kDefaultNcclPort = 29501;
Result<int> nccl_bootstrap_port(const RankEnv& rank, const EnvLookup& env);
// NCCL_COMM_ID's value, "<addr>:<port>" ("[addr]:port" for IPv6): the user's NCCL_COMM_ID when
// set, else master_addr and nccl_bootstrap_port. Fails for several ranks without an address.
Result<std::string> nccl_comm_id(const RankEnv& rank, const EnvLookup& env);

// NVLink SHARP (NVLS) multicast stays off: NCCL_NVLS_ENABLE=0 unless the user set the variable,
// whose value then stands. What a child's environment must add for it (empty when the user set
// it), and the same for this process before its first NCCL call (returns whether it set it).
inline constexpr std::string_view kNvlsVariable = "NCCL_NVLS_ENABLE";
std::map<std::string, std::string> nccl_child_env(const EnvLookup& env);
bool disable_nvls_in_process();

}  // namespace dlprobe
