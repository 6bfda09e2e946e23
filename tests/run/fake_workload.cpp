// A stand-in for a training script, built with the tests: it prints the dlprobe line protocol (or
// regex-style lines), holds host memory, can spawn a child, write its pid into a fake-NVML process
// file, run out of memory in a framework's words, hang, ignore SIGINT or die by a signal.
//
//   --steps N --step-ms MS --data-ms MS --batch B    timed steps (default 10 x 5 ms, batch 32)
//   --alloc-mib N        touch N MiB of host memory first
//   --child              fork a child that runs the steps (the parent waits), so the work and
//                        the GPU memory belong to a grandchild of dlprobe
//   --gpu-file PATH --gpu-bytes N   write "PID N" (the worker's pid) to PATH, as NVML would list
//   --oom-at-batch N --oom-style pytorch|tf|jax   with batch >= N, print that framework's OOM
//                        error after two steps and exit 1
//   --oom-protocol       report the OOM through the protocol ("oom": true) instead
//   --hang               after the steps, sleep without output until killed
//   --ignore-sigint      keep running through SIGINT
//   --ignore-sigterm     keep running through SIGTERM
//   --setsid-child PATH  first fork a child that leaves the session (setsid) and sleeps until
//                        killed, as a daemonised helper does; its pid is written to PATH
//   --signal SIG         raise SIG after the steps
//   --exit N             exit status after the steps
//   --regex              print "step N: X img/s" instead of protocol lines
//   --seed               print no step lines, only "Throughput: X samples/sec", "Average Step
//                        Time: Xs" and "Batch Size: N" at the end, as the seed's scripts do
//   --precision P --channels-last 0|1   reported in the first protocol line
//   --spin-ms MS         keep one core busy for MS before the first step (as a framework
//                        compiling or autotuning does)
//   --busy               the steps keep the core busy instead of sleeping (a host-bound loop)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

struct Args {
  int steps = 10;
  int step_ms = 5;
  int data_ms = 0;
  long batch = 32;
  long alloc_mib = 0;
  bool child = false;
  std::string gpu_file;
  long long gpu_bytes = 0;
  long oom_at_batch = 0;
  std::string oom_style = "pytorch";
  bool oom_protocol = false;
  bool hang = false;
  bool ignore_sigint = false;
  bool ignore_sigterm = false;
  std::string setsid_child;
  int signal = 0;
  int exit_code = 0;
  bool regex = false;
  bool seed = false;
  std::string precision;
  int channels_last = -1;
  int spin_ms = 0;
  bool busy = false;
};

void sleep_ms(int ms) {
  if (ms > 0) usleep(static_cast<useconds_t>(ms) * 1000U);
}

void spin_ms(int ms) {
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long elapsed =
        (now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L;
    if (elapsed >= ms) return;
  }
}

// The child of --setsid-child: in a session of its own, so no signal to our process group reaches
// it. Its pid is written only once it has left, so a reader of PATH sees a child that has.
void start_setsid_child(const std::string& path) {
  int ready[2];
  if (pipe(ready) != 0) std::exit(3);
  const pid_t pid = fork();
  if (pid < 0) std::exit(3);
  if (pid == 0) {
    setsid();
    [[maybe_unused]] const auto n = write(ready[1], "x", 1);
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  if (read(ready[0], &byte, 1) != 1) std::exit(3);
  close(ready[0]);
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "%d\n", static_cast<int>(pid));
    std::fclose(f);
  }
}

void oom(const Args& a) {
  if (a.oom_protocol) {
    std::printf(
        "{\"dlprobe\": {\"oom\": true, \"framework\": \"pytorch\", \"message\": \"batch %ld\"}}\n",
        a.batch);
  } else if (a.oom_style == "tf") {
    std::fprintf(stderr,
                 "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
                 "allocating tensor with shape[%ld,64,112,112] and type float on "
                 "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n",
                 a.batch);
  } else if (a.oom_style == "jax") {
    std::fprintf(stderr,
                 "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
                 "trying to allocate 4294967296 bytes.\n");
  } else {
    std::fprintf(stderr,
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                 "has a total capacity of 139.81 GiB of which 1.02 GiB is free.\n");
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(1);
}

int work(const Args& a) {
  if (!a.gpu_file.empty()) {
    // Written whole and renamed, so a reader never sees half a line.
    const std::string tmp = a.gpu_file + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%d %lld\n", static_cast<int>(getpid()), a.gpu_bytes);
      std::fclose(f);
      std::rename(tmp.c_str(), a.gpu_file.c_str());
    }
  }
  std::vector<char> host;
  if (a.alloc_mib > 0) {
    host.resize(static_cast<std::size_t>(a.alloc_mib) << 20);
    for (std::size_t i = 0; i < host.size(); i += 4096) host[i] = 1;
  }
  spin_ms(a.spin_ms);
  for (int step = 0; step < a.steps; ++step) {
    if (a.oom_at_batch > 0 && a.batch >= a.oom_at_batch && step == 2) oom(a);
    sleep_ms(a.data_ms);
    if (a.busy) {
      spin_ms(a.step_ms);
    } else {
      sleep_ms(a.step_ms);
    }
    const double step_s = (a.data_ms + a.step_ms) / 1000.0;
    if (a.seed) continue;  // the seed's scripts print only at the end
    if (a.regex) {
      std::printf("step %d: %.1f img/s\n", step, static_cast<double>(a.batch) / step_s);
    } else {
      std::printf(
          "{\"dlprobe\": {\"step\": %d, \"step_time_s\": %.6f, \"data_time_s\": %.6f, "
          "\"batch\": %ld, \"framework_peak_bytes\": %ld",
          step, step_s, a.data_ms / 1000.0, a.batch, a.batch * 1048576L);
      if (step == 0 && !a.precision.empty()) {
        std::printf(", \"precision\": \"%s\"", a.precision.c_str());
      }
      if (step == 0 && a.channels_last >= 0) {
        std::printf(", \"channels_last\": %s", a.channels_last != 0 ? "true" : "false");
      }
      std::printf("}}\n");
    }
    std::fflush(stdout);
  }
  if (a.seed) {
    const double step_s = (a.data_ms + a.step_ms) / 1000.0;
    std::printf("Throughput: %.2f samples/sec\nAverage Step Time: %.4fs\nBatch Size: %ld\n",
                static_cast<double>(a.batch) / step_s, step_s, a.batch);
  } else if (!a.regex) {
    std::printf("{\"dlprobe\": {\"end\": true}}\n");
  }
  std::fflush(stdout);
  if (a.hang) {
    for (;;) pause();
  }
  if (a.signal != 0) raise(a.signal);
  return a.exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fake_workload: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--steps")
      a.steps = std::atoi(value());
    else if (k == "--step-ms")
      a.step_ms = std::atoi(value());
    else if (k == "--data-ms")
      a.data_ms = std::atoi(value());
    else if (k == "--batch")
      a.batch = std::atol(value());
    else if (k == "--alloc-mib")
      a.alloc_mib = std::atol(value());
    else if (k == "--child")
      a.child = true;
    else if (k == "--gpu-file")
      a.gpu_file = value();
    else if (k == "--gpu-bytes")
      a.gpu_bytes = std::atoll(value());
    else if (k == "--oom-at-batch")
      a.oom_at_batch = std::atol(value());
    else if (k == "--oom-style")
      a.oom_style = value();
    else if (k == "--oom-protocol")
      a.oom_protocol = true;
    else if (k == "--hang")
      a.hang = true;
    else if (k == "--ignore-sigint")
      a.ignore_sigint = true;
    else if (k == "--ignore-sigterm")
      a.ignore_sigterm = true;
    else if (k == "--setsid-child")
      a.setsid_child = value();
    else if (k == "--signal")
      a.signal = std::atoi(value());
    else if (k == "--exit")
      a.exit_code = std::atoi(value());
    else if (k == "--regex")
      a.regex = true;
    else if (k == "--seed")
      a.seed = true;
    else if (k == "--precision")
      a.precision = value();
    else if (k == "--channels-last")
      a.channels_last = std::atoi(value());
    else if (k == "--spin-ms")
      a.spin_ms = std::atoi(value());
    else if (k == "--busy")
      a.busy = true;
    else {
      std::fprintf(stderr, "fake_workload: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.ignore_sigint) signal(SIGINT, SIG_IGN);
  if (a.ignore_sigterm) signal(SIGTERM, SIG_IGN);
  if (!a.setsid_child.empty()) start_setsid_child(a.setsid_child);
  if (!a.child) return work(a);
  const pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid == 0) _exit(work(a));
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) raise(WTERMSIG(status));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}
