// A CUDA injection library (CUDA_INJECTION64_PATH) that lists the CUDA runtime and driver calls
// that took longer than SLOW_CALLS_MS (default 2) milliseconds, by call and thread, when the
// process ends: which call holds a thread up when two pieces of GPU work share a process (the
// GPU input pipeline's decoding beside a training step). Written here because Nsight Systems
// does not run on the GPU machine; CUPTI's callback API does the tracing.
#include <cupti.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace {

struct Slow {
  long count = 0;
  double total_ms = 0;
  double max_ms = 0;
};

std::mutex mu;
std::map<std::tuple<std::string, std::string, long>, Slow>* slow = nullptr;
double threshold_ms = 2.0;

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CUPTI's callback: the entry time goes into the call's own correlation slot, so that nested
// calls and calls already running when tracing began pair up correctly (a call with no recorded
// entry is not counted).
void CUPTIAPI on_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite == CUPTI_API_ENTER) {
    if (info->correlationData != nullptr)
      *info->correlationData = std::bit_cast<std::uint64_t>(now_ms());
    return;
  }
  if (info->correlationData == nullptr || *info->correlationData == 0) return;
  const double took = now_ms() - std::bit_cast<double>(*info->correlationData);
  if (took < threshold_ms) return;
  const long tid = syscall(SYS_gettid);
  std::lock_guard lock(mu);
  Slow& s = (*slow)[{domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime" : "driver",
                     info->functionName, tid}];
  ++s.count;
  s.total_ms += took;
  if (took > s.max_ms) s.max_ms = took;
}

void report() {
  std::lock_guard lock(mu);
  std::FILE* f = std::fopen(
      std::getenv("SLOW_CALLS_OUT") ? std::getenv("SLOW_CALLS_OUT") : "/dev/stderr", "w");
  if (f == nullptr) return;
  std::fprintf(f, "%-8s %-44s %8s %7s %10s %9s %9s\n", "domain", "call", "thread", "count",
               "total ms", "mean ms", "max ms");
  for (const auto& [key, s] : *slow) {
    std::fprintf(f, "%-8s %-44s %8ld %7ld %10.1f %9.2f %9.2f\n", std::get<0>(key).c_str(),
                 std::get<1>(key).c_str(), std::get<2>(key), s.count, s.total_ms,
                 s.total_ms / static_cast<double>(s.count), s.max_ms);
  }
  if (f != stderr) std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  if (const char* ms = std::getenv("SLOW_CALLS_MS")) threshold_ms = std::atof(ms);
  slow = new std::map<std::tuple<std::string, std::string, long>, Slow>;
  CUpti_SubscriberHandle subscriber = nullptr;
  if (cuptiSubscribe(&subscriber, on_call, nullptr) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS ||
      cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "slow_calls: CUPTI's callbacks could not be enabled\n");
    return 0;
  }
  std::atexit(report);
  return 1;
}
