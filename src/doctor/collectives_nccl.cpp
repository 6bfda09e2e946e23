// The NCCL sweep on the GPUs. NCCL is loaded with dlopen (nccl.h gives the types only), so dlprobe
// starts where NCCL is not installed and says so in the report instead. Each size is timed with
// CUDA events on every rank's stream over the iterations after warm-up, and the slowest rank's
// mean is the figure, as in nccl-tests.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"
#include "dlprobe/core/log.h"
#include "dlprobe/core/units.h"
#include "dlprobe/doctor/collectives.h"

namespace dlprobe::doctor {

namespace {

struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
};

// Loaded once and never closed: unloading NCCL runs its destructors against state its threads
// may still hold.
Result<const NcclApi*> load_nccl() {
  static NcclApi api;
  static std::string failure;
  static bool tried = false;
  if (!tried) {
    tried = true;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      failure = fmt::format("cannot load libnccl.so.2: {}", why != nullptr ? why : "unknown");
    } else {
      bool all = true;
      auto sym = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
        if (fn == nullptr && failure.empty()) failure = fmt::format("libnccl.so.2 lacks {}", name);
        all = all && fn != nullptr;
      };
      sym(api.get_version, "ncclGetVersion");
      sym(api.get_unique_id, "ncclGetUniqueId");
      sym(api.comm_init_all, "ncclCommInitAll");
      sym(api.comm_init_rank, "ncclCommInitRank");
      sym(api.comm_destroy, "ncclCommDestroy");
      sym(api.error_string, "ncclGetErrorString");
      sym(api.group_start, "ncclGroupStart");
      sym(api.group_end, "ncclGroupEnd");
      sym(api.all_reduce, "ncclAllReduce");
      sym(api.all_gather, "ncclAllGather");
      sym(api.reduce_scatter, "ncclReduceScatter");
      if (all) failure.clear();
    }
  }
  if (!failure.empty()) return error(Errc::unavailable, failure);
  return &api;
}

#define DLPROBE_NCCL_CHECK(api, call) \
  DLPROBE_API_CHECK("NCCL", call, rc_ == ncclSuccess, (api).error_string(rc_))

// One rank driven by this process: its device, communicator, stream, buffers and events.
struct LocalRank {
  int device = 0;
  int rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
  void* scratch = nullptr;  // one value, for exchanging the slowest time and the least memory
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
};

// Frees everything at scope exit, whichever step failed.
struct Ranks {
  const NcclApi* api = nullptr;
  std::vector<LocalRank> ranks;
  Ranks() = default;
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  ~Ranks() {
    for (auto& r : ranks) {
      cudaSetDevice(r.device);
      if (r.stream != nullptr) cudaStreamSynchronize(r.stream);
      if (r.comm != nullptr) api->comm_destroy(r.comm);
      if (r.start != nullptr) cudaEventDestroy(r.start);
      if (r.stop != nullptr) cudaEventDestroy(r.stop);
      if (r.send != nullptr) cudaFree(r.send);
      if (r.recv != nullptr) cudaFree(r.recv);
      if (r.scratch != nullptr) cudaFree(r.scratch);
      if (r.stream != nullptr) cudaStreamDestroy(r.stream);
    }
  }
};

// Launches one collective of `bytes` on every local rank inside a group (one thread drives all of
// this process's communicators, which NCCL requires to be grouped).
Status launch(const NcclApi& api, std::vector<LocalRank>& ranks, Collective c, std::uint64_t bytes,
              int world) {
  const std::size_t count = bytes / sizeof(float);
  const std::size_t shard = count / static_cast<std::size_t>(world);
  DLPROBE_NCCL_CHECK(api, api.group_start());
  for (auto& r : ranks) {
    switch (c) {
      case Collective::all_reduce:
        DLPROBE_NCCL_CHECK(
            api, api.all_reduce(r.send, r.recv, count, ncclFloat, ncclSum, r.comm, r.stream));
        break;
      case Collective::all_gather:
        DLPROBE_NCCL_CHECK(api, api.all_gather(r.send, r.recv, shard, ncclFloat, r.comm, r.stream));
        break;
      case Collective::reduce_scatter:
        DLPROBE_NCCL_CHECK(
            api, api.reduce_scatter(r.send, r.recv, shard, ncclFloat, ncclSum, r.comm, r.stream));
        break;
    }
  }
  DLPROBE_NCCL_CHECK(api, api.group_end());
  return Status::ok();
}

// All ranks' `value` reduced with `op`, through the communicators themselves (no other channel
// between processes exists).
template <class T>
Result<T> exchange(const NcclApi& api, std::vector<LocalRank>& ranks, T value, ncclDataType_t type,
                   ncclRedOp_t op) {
  for (auto& r : ranks) {
    DLPROBE_CUDA_CHECK(cudaSetDevice(r.device));
    DLPROBE_CUDA_CHECK(cudaMemcpy(r.scratch, &value, sizeof(T), cudaMemcpyHostToDevice));
  }
  DLPROBE_NCCL_CHECK(api, api.group_start());
  for (auto& r : ranks)
    DLPROBE_NCCL_CHECK(api, api.all_reduce(r.scratch, r.scratch, 1, type, op, r.comm, r.stream));
  DLPROBE_NCCL_CHECK(api, api.group_end());
  T out{};
  for (auto& r : ranks) {
    DLPROBE_CUDA_CHECK(cudaSetDevice(r.device));
    DLPROBE_CUDA_CHECK(cudaStreamSynchronize(r.stream));
    DLPROBE_CUDA_CHECK(cudaMemcpy(&out, r.scratch, sizeof(T), cudaMemcpyDeviceToHost));
  }
  return out;
}

// Seconds per call: warm-up, then `iterations` calls between two events on every stream; the
// slowest rank decides.
Result<double> time_collective(const NcclApi& api, std::vector<LocalRank>& ranks, Collective c,
                               std::uint64_t bytes, int world, const CollectiveOptions& o) {
  for (int i = 0; i < o.warmup; ++i) DLPROBE_RETURN_IF_ERROR(launch(api, ranks, c, bytes, world));
  for (auto& r : ranks) {
    DLPROBE_CUDA_CHECK(cudaSetDevice(r.device));
    DLPROBE_CUDA_CHECK(cudaStreamSynchronize(r.stream));
    DLPROBE_CUDA_CHECK(cudaEventRecord(r.start, r.stream));
  }
  for (int i = 0; i < o.iterations; ++i)
    DLPROBE_RETURN_IF_ERROR(launch(api, ranks, c, bytes, world));
  double slowest_ms = 0;
  for (auto& r : ranks) {
    DLPROBE_CUDA_CHECK(cudaSetDevice(r.device));
    DLPROBE_CUDA_CHECK(cudaEventRecord(r.stop, r.stream));
    DLPROBE_CUDA_CHECK(cudaEventSynchronize(r.stop));
    float ms = 0;
    DLPROBE_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    slowest_ms = std::max(slowest_ms, static_cast<double>(ms));
  }
  if (static_cast<int>(ranks.size()) < world) {
    DLPROBE_ASSIGN_OR_RETURN(slowest_ms, exchange(api, ranks, slowest_ms, ncclFloat64, ncclMax));
  }
  return slowest_ms / 1e3 / o.iterations;
}

}  // namespace

Result<CollectiveReport> measure_collectives(const CollectiveOptions& o, const RankEnv& env) {
  if (o.warmup < 0 || o.iterations < 1)
    return invalid_argument("collectives: warm-up must be >= 0 and iterations >= 1");
  CollectiveReport report;
  auto loaded = load_nccl();
  if (!loaded) {
    report.why_not = loaded.status().message();
    return report;
  }
  const NcclApi& api = **loaded;
  int version = 0;
  if (api.get_version(&version) == ncclSuccess)
    report.nccl_version =
        fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  report.nvls = nvls != nullptr ? nvls : "unset";

  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) {
    cudaGetLastError();
    report.why_not = "the CUDA runtime sees no device";
    return report;
  }
  Ranks owned;
  owned.api = &api;
  auto& ranks = owned.ranks;
  if (env.world_size > 1) {
    // One rank per process: this process's GPU is its local rank among the visible ones, or the
    // only one when the launcher gave each rank its own (srun --gpus-per-task=1).
    const int device = visible == 1 ? 0 : env.local_rank;
    if (device >= visible)
      return invalid_argument(fmt::format("local rank {} ({}) but only {} GPUs are visible here",
                                          env.local_rank, launcher_name(env.launcher), visible));
    auto comm_id = nccl_comm_id(env, process_env());
    if (!comm_id) return comm_id.status();
    // With NCCL_COMM_ID set every rank's ncclGetUniqueId gives the same id, and rank 0 listens on
    // that address during ncclCommInitRank: no id needs to travel between the processes.
    setenv("NCCL_COMM_ID", comm_id->c_str(), 1);
    report.mode = fmt::format("one rank per process ({}), rank {} of {}, NCCL_COMM_ID={}",
                              launcher_name(env.launcher), env.rank, env.world_size, *comm_id);
    report.ranks = env.world_size;
    ranks.push_back({});
    ranks.back().device = device;
    ranks.back().rank = env.rank;
    ncclUniqueId id{};
    DLPROBE_NCCL_CHECK(api, api.get_unique_id(&id));
    DLPROBE_CUDA_CHECK(cudaSetDevice(device));
    DLPROBE_NCCL_CHECK(api, api.comm_init_rank(&ranks.back().comm, env.world_size, id, env.rank));
  } else {
    report.ranks = visible;
    report.mode =
        fmt::format("one process, {} GPU{} (ncclCommInitAll)", visible, visible == 1 ? "" : "s");
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(visible));
    std::vector<int> devices(static_cast<std::size_t>(visible));
    for (int d = 0; d < visible; ++d) devices[static_cast<std::size_t>(d)] = d;
    DLPROBE_NCCL_CHECK(api, api.comm_init_all(comms.data(), visible, devices.data()));
    for (int d = 0; d < visible; ++d) {
      ranks.push_back({});
      ranks.back().device = d;
      ranks.back().rank = d;
      ranks.back().comm = comms[static_cast<std::size_t>(d)];
    }
  }
  std::uint64_t least_free = ~0ull;
  for (auto& r : ranks) {
    report.devices.push_back(r.device);
    DLPROBE_CUDA_CHECK(cudaSetDevice(r.device));
    DLPROBE_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    DLPROBE_CUDA_CHECK(cudaEventCreate(&r.start));
    DLPROBE_CUDA_CHECK(cudaEventCreate(&r.stop));
    DLPROBE_CUDA_CHECK(cudaMalloc(&r.scratch, sizeof(double)));
    std::size_t free_bytes = 0, total = 0;
    DLPROBE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    least_free = std::min<std::uint64_t>(least_free, free_bytes);
  }
  if (static_cast<int>(ranks.size()) < report.ranks) {
    DLPROBE_ASSIGN_OR_RETURN(
        least_free,
        exchange(api, ranks, static_cast<std::uint64_t>(least_free), ncclUint64, ncclMin));
  }
  const std::uint64_t max_bytes =
      sweep_max_bytes(least_free, o.bounds.max_bytes, o.bounds.min_bytes);
  if (max_bytes == 0) {
    report.why_not = fmt::format("{} free on the fullest GPU: not even {} fits",
                                 format_size(least_free), format_size(o.bounds.min_bytes));
    return report;
  }
  report.max_bytes = max_bytes;
  if (max_bytes < o.bounds.max_bytes && 2 * max_bytes <= o.bounds.max_bytes) {
    report.max_bytes_note = fmt::format(
        "sizes stop at {} (of {} asked): the fullest GPU has {} free, and all-reduce "
        "needs two buffers of the message with {:.0f}% left for NCCL",
        format_size(max_bytes), format_size(o.bounds.max_bytes), format_size(least_free),
        100 * kNcclMemoryHeadroom);
  }
  for (auto& r : ranks) {
    DLPROBE_CUDA_CHECK(cudaSetDevice(r.device));
    DLPROBE_CUDA_CHECK(cudaMalloc(&r.send, max_bytes));
    DLPROBE_CUDA_CHECK(cudaMalloc(&r.recv, max_bytes));
    DLPROBE_CUDA_CHECK(cudaMemset(r.send, 0, max_bytes));
  }
  for (Collective c : o.collectives) {
    CollectiveSweep sweep;
    sweep.collective = c;
    for (std::uint64_t requested : sweep_sizes(o.bounds.min_bytes, max_bytes)) {
      const std::uint64_t bytes = collective_bytes(c, requested, report.ranks, sizeof(float));
      if (bytes == 0) continue;  // less than one element per rank
      DLPROBE_ASSIGN_OR_RETURN(double seconds,
                               time_collective(api, ranks, c, bytes, report.ranks, o));
      CollectivePoint p;
      p.bytes = bytes;
      p.time_us = seconds * 1e6;
      p.algbw_gbs = algbw_gbs(bytes, seconds);
      p.busbw_gbs = busbw_gbs(c, bytes, seconds, report.ranks);
      if (p.busbw_gbs)
        sweep.peak_busbw_gbs = std::max(sweep.peak_busbw_gbs.value_or(0), *p.busbw_gbs);
      log_debug("NCCL {} {} B: {:.1f} us", collective_name(c), bytes, p.time_us);
      sweep.points.push_back(p);
    }
    report.sweeps.push_back(std::move(sweep));
  }
  if (report.ranks == 1) report.note = one_rank_note();
  report.measured = true;
  return report;
}

}  // namespace dlprobe::doctor
