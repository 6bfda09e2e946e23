#include "dlprobe/device/fastest_settings.h"

#include <fmt/format.h>

#include <algorithm>

namespace dlprobe::device {

FastestSettings fastest_settings(DeviceKind device, engine::Precision precision) {
  FastestSettings s;
  if (device == DeviceKind::cuda) {
    // On an H200 (docs/performance.md): the tensor-core precisions in NHWC, where their
    // convolutions need no transposes (tf32 3,128 img/s against 2,078 in NCHW); strict fp32 in
    // NCHW, where cuDNN's NHWC data gradient ran 28 times slower. The planned arena, and a graph
    // replay in every mode: fp16 ResNet-50 gradients ran 2,429 img/s in NCHW, grown, eager and
    // 7,216 in NHWC, planned, replayed; fp16 training replayed against eager steps, SGD 5,168
    // against 4,970 img/s at batch 32 and 8,445 against 8,322 at 256, AdamW 5,125 against 4,960
    // and 8,453 against 8,343 (one call, 2026-12-05).
    s.layout = precision == engine::Precision::fp32 || precision == engine::Precision::fp64
                   ? Layout::nchw
                   : Layout::nhwc;
    s.planned = true;
    s.graph = true;
    // The weight gradients on a second stream: fp16 ResNet-50 gradients ran 1.0 % faster at batch
    // 32, 2.4 % at 64 and 2.0 % at 128, and training (eager) 9.6 % at 32 and 3.0 % at 128; but
    // gradients 0.7 % at 256 for 11.85 against 9.26 GiB (their operands are kept until the
    // gradients are read). bf16 gradients (batch norm inside the convolutions) ran 3.1 % faster at
    // 32, 3.0 % at 64 and 2.1 % at 128 on an H100, and tf32 4.2 % at 64 and 3.4 % at 128
    // (2026-12-06). Those three precisions were measured, so only they take it. At 256 the H100
    // ran fp16 1.0 %, bf16 2.0 % and tf32 2.8 % faster on two, for 3.1, 1.8 and 3.0 GiB more
    // (fp16 11.85 against 8.76): above the peers' memory. There stream 0 waits for a weight
    // gradient 16 calls behind (StepConfig::stream_lag): fp16 0.7 %, bf16 1.2 % and tf32 2.7 %
    // faster than one stream for 0.22, 0.19 and 0.09 GiB more (H100, 2026-12-06, docs/bench.md
    // "Streams"); at batch 32 that lag ran below one stream (fp16 5,059 against 5,160 img/s) and
    // at 128 below two unbounded (bf16 6,558 against 6,613), so it starts above 128.
    if (precision == engine::Precision::fp16 || precision == engine::Precision::bf16 ||
        precision == engine::Precision::tf32) {
      s.two_streams_up_to = 128;
      s.stream_lag_above = 16;
    }
    return s;
  }
  // oneDNN's NHWC convolutions are its brgconv / jit kernels, NCHW's im2col and SGEMM
  // (docs/cpu-backend.md): ResNet-18 training at 32x32, batch 8, one thread on an AVX2 VM ran
  // 14.5-16.0 img/s in NHWC against 11.3-11.6 in NCHW. The planned arena was no faster there
  // (13.9-16.5 img/s against 15.5-17.5 grown), and the CPU backends record no graphs.
  s.layout = Layout::nhwc;
  s.planned = false;
  s.graph = false;
  return s;
}

void Picks::add(std::string_view value, std::string_view what) {
  auto it =
      std::find_if(picks_.begin(), picks_.end(), [&](const auto& p) { return p.first == value; });
  if (it == picks_.end()) it = picks_.insert(picks_.end(), {std::string(value), {}});
  if (std::find(it->second.begin(), it->second.end(), what) == it->second.end()) {
    it->second.emplace_back(what);
  }
}

std::string Picks::text() const {
  if (picks_.size() == 1) return picks_.front().first;
  std::vector<std::string> parts;
  for (const auto& [value, what] : picks_) {
    parts.push_back(fmt::format("{} for {}", value, fmt::join(what, "/")));
  }
  return fmt::format("{}", fmt::join(parts, " and "));
}

std::string_view layout_flag(Layout layout) {
  return layout == Layout::nhwc ? "nhwc" : "nchw";
}

}  // namespace dlprobe::device
