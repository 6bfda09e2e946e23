// Multi-tensor kernels: gradient unscaling, SGD and AdamW over every parameter in one launch.
// The host packs the groups and their chunks into one table (launch_plan.h) and uploads it (once,
// into the graph's scratch, where a graph is recorded); each
// block walks chunks grid-stride and its threads the chunk's elements, four at a time (float4)
// where the group's arrays are 16-byte aligned. The per-element arithmetic follows
// torch.optim's formulas term by term in fp32, in the order of the host backends'
// (host_optimizer.h).
#include <optional>
#include <vector>

#include "cuda_common.cuh"

namespace dlprobe::cuda {
namespace {

constexpr int kOptBlock = 512;

// Applies `update(p0, p1, p2, p3)` to every element of every chunk; arrays whose bit is set in
// kWrites are stored back. Missing (null) arrays read as zero and are never stored.
template <unsigned kWrites, class Update>
__device__ void for_each_element(const PackedTensors* groups, const PackedChunk* chunks,
                                 std::int64_t chunk_count, const Update& update) {
  for (std::int64_t k = blockIdx.x; k < chunk_count; k += gridDim.x) {
    const PackedChunk ch = chunks[k];
    const PackedTensors g = groups[ch.tensor];
    float* p[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) p[a] = static_cast<float*>(g.ptr[a]);
    std::int64_t scalar_begin = ch.begin;
    if (g.vectorizable != 0) {
      // Chunks start at multiples of 4 (kMultiTensorChunk), so quads never straddle two.
      const std::int64_t q_end = ch.end / 4;
      for (std::int64_t q = ch.begin / 4 + threadIdx.x; q < q_end; q += blockDim.x) {
        float4 v[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          v[a] = p[a] != nullptr ? reinterpret_cast<const float4*>(p[a])[q]
                                 : make_float4(0.0F, 0.0F, 0.0F, 0.0F);
        }
        update(v[0].x, v[1].x, v[2].x, v[3].x);
        update(v[0].y, v[1].y, v[2].y, v[3].y);
        update(v[0].z, v[1].z, v[2].z, v[3].z);
        update(v[0].w, v[1].w, v[2].w, v[3].w);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          if (((kWrites >> a) & 1U) != 0 && p[a] != nullptr) {
            reinterpret_cast<float4*>(p[a])[q] = v[a];
          }
        }
      }
      scalar_begin = imax(ch.begin, q_end * 4);
    }
    for (std::int64_t i = scalar_begin + threadIdx.x; i < ch.end; i += blockDim.x) {
      float v[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) v[a] = p[a] != nullptr ? p[a][i] : 0.0F;
      update(v[0], v[1], v[2], v[3]);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        if (((kWrites >> a) & 1U) != 0 && p[a] != nullptr) p[a][i] = v[a];
      }
    }
  }
}

struct Unscale {
  float inv_scale;
  float* found_inf;
  __device__ void operator()(float& g, float&, float&, float&) const {
    // The check is on the scaled value, as torch's _amp_foreach_non_finite_check_and_unscale_.
    if (!isfinite(g)) *found_inf = 1.0F;
    g = g * inv_scale;
  }
};

// What a launch's update is made from at run time: each rule's `at` takes the step's counters as
// the kernel reads them, so that a replayed graph updates with the values of the moment.
struct UnscaleRule {
  float* found_inf;
  __device__ Unscale at(const StepCounters& c) const {
    // torch: scale.double().reciprocal().float().
    return {static_cast<float>(1.0 / c.loss_scale), found_inf};
  }
};

struct Sgd {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
  __device__ void operator()(float& w, float& g, float& buf, float&) const {
    float d = g;
    if (weight_decay != 0.0F) d = d + weight_decay * w;
    if (momentum != 0.0F) {
      // The first step copies the gradient into the buffer: no dampening on it.
      buf = first_step ? d : momentum * buf + (1.0F - dampening) * d;
      d = nesterov ? d + momentum * buf : buf;
    }
    w = w - lr * d;
  }
};

struct SgdRule {
  Sgd sgd;  // first_step set by at()
  __device__ Sgd at(const StepCounters& c) const {
    Sgd s = sgd;
    s.first_step = c.steps_taken == 0.0;
    return s;
  }
};

struct AdamW {
  float lr_decay;  // 1 - lr * weight_decay
  float weight1;   // 1 - beta1
  float beta2, weight2, eps, step_size, bias_correction2_sqrt;
  bool first_step;
  __device__ void operator()(float& w, float& g, float& m, float& v) const {
    // torch.optim initialises both moments to zero at the first step; the buffers are not read
    // then, so the caller need not clear them.
    if (first_step) {
      m = 0.0F;
      v = 0.0F;
    }
    w = w * lr_decay;
    // exp_avg.lerp_(grad, 1 - beta1), from whichever end is nearer the weight, as torch.lerp.
    const float diff = g - m;
    m = fabsf(weight1) < 0.5F ? m + weight1 * diff : g - diff * (1.0F - weight1);
    v = v * beta2 + weight2 * g * g;
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    w = w - step_size * m / denom;
  }
};

struct AdamWRule {
  double lr, beta1, beta2, eps, weight_decay;
  __device__ AdamW at(const StepCounters& c) const {
    // The per-step scalars are Python floats (double) in torch.optim; they meet the tensors in
    // fp32.
    const double step = c.steps_taken + 1.0;
    const double bias_correction1 = 1.0 - pow(beta1, step);
    const double bias_correction2 = 1.0 - pow(beta2, step);
    return {static_cast<float>(1.0 - lr * weight_decay),
            static_cast<float>(1.0 - beta1),
            static_cast<float>(beta2),
            static_cast<float>(1.0 - beta2),
            static_cast<float>(eps),
            static_cast<float>(lr / bias_correction1),
            static_cast<float>(sqrt(bias_correction2)),
            step == 1.0};
  }
};

template <unsigned kWrites, class Rule>
__global__ void multi_tensor_kernel(const PackedTensors* groups, const PackedChunk* chunks,
                                    std::int64_t chunk_count, Rule rule,
                                    const StepCounters* counters, const float* skip_if_set) {
  // The step a dynamic loss scaler skips: nothing in this launch writes the flag.
  if (skip_if_set != nullptr && *skip_if_set != 0.0F) return;
  // One thread a block works the update out (AdamW's takes two powers in double).
  using Update = decltype(rule.at(*counters));
  __shared__ Update update;
  if (threadIdx.x == 0) update = rule.at(*counters);
  __syncthreads();
  for_each_element<kWrites>(groups, chunks, chunk_count, update);
}

// GradScaler.update and the step count: advance_step_counters (ops.cpp) in the same order.
__global__ void advance_kernel(StepCounters* counters, GradScalerOptions scaler, bool scaling,
                               const float* found_inf) {
  StepCounters c = *counters;
  c.last_loss_scale = c.loss_scale;
  const bool found = found_inf != nullptr && *found_inf != 0.0F;
  if (!scaling) {
    c.steps_taken += 1.0;
  } else if (found) {
    c.loss_scale *= scaler.backoff_factor;
    c.growth_tracker = 0.0;
  } else {
    c.steps_taken += 1.0;
    c.growth_tracker += 1.0;
    if (c.growth_tracker == static_cast<double>(scaler.growth_interval)) {
      const double grown = c.loss_scale * scaler.growth_factor;
      if (isfinite(grown)) c.loss_scale = grown;
      c.growth_tracker = 0.0;
    }
  }
  *counters = c;
}

template <unsigned kWrites, class Rule>
Status launch_multi_tensor(const KernelContext& ctx, const MultiTensorPack& pack, const Rule& rule,
                           const StepCounters* counters, const float* skip_if_set,
                           std::string_view op) {
  if (pack.chunks.empty()) return Status::ok();
  std::vector<std::byte> host(pack.bytes());
  pack.write(host.data());
  std::optional<Scratch> table;
  const std::byte* base = nullptr;
  if (ctx.pool != nullptr) {
    // While a graph is recorded the table is kept with it and filled now, once: a recorded copy
    // would read `host` again at every replay, long after it is gone, and scratch the pool lends
    // to a later call would be overwritten by it. The capture is relaxed, which lets this
    // synchronous copy run beside it.
    DLPROBE_ASSIGN_OR_RETURN(void* kept, ctx.pool->keep(*ctx.allocator, host.size(), op));
    DLPROBE_CUDA_CHECK(cudaMemcpy(kept, host.data(), host.size(), cudaMemcpyHostToDevice));
    base = static_cast<const std::byte*>(kept);
  } else {
    DLPROBE_ASSIGN_OR_RETURN(Scratch lent, scratch(ctx, pack.bytes(), op));
    table.emplace(std::move(lent));
    // From pageable memory: staged before the call returns, so `host` may go out of scope.
    DLPROBE_CUDA_CHECK(cudaMemcpyAsync(table->data(), host.data(), host.size(),
                                       cudaMemcpyHostToDevice, ctx.stream));
    base = static_cast<const std::byte*>(table->data());
  }
  const auto chunk_count = static_cast<std::int64_t>(pack.chunks.size());
  const auto grid = static_cast<unsigned>(std::min<std::int64_t>(chunk_count, 4LL * ctx.sm_count));
  multi_tensor_kernel<kWrites><<<grid, kOptBlock, 0, ctx.stream>>>(
      reinterpret_cast<const PackedTensors*>(base),
      reinterpret_cast<const PackedChunk*>(base + pack.chunk_offset()), chunk_count, rule, counters,
      skip_if_set);
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

}  // namespace

Status launch_unscale(const KernelContext& ctx, const MultiTensorPack& pack,
                      const StepCounters* counters, float* found_inf) {
  return launch_multi_tensor<0b0001U>(ctx, pack, UnscaleRule{found_inf}, counters, nullptr,
                                      "unscale_gradients");
}

Status launch_sgd(const KernelContext& ctx, const MultiTensorPack& pack, const SgdParams& p,
                  const StepCounters* counters, const float* found_inf) {
  const SgdRule rule{{static_cast<float>(p.lr), static_cast<float>(p.momentum),
                      static_cast<float>(p.dampening), static_cast<float>(p.weight_decay),
                      p.nesterov, false}};
  return launch_multi_tensor<0b0101U>(ctx, pack, rule, counters, found_inf, "sgd_step");
}

Status launch_adamw(const KernelContext& ctx, const MultiTensorPack& pack, const AdamWParams& p,
                    const StepCounters* counters, const float* found_inf) {
  const AdamWRule rule{p.lr, p.beta1, p.beta2, p.eps, p.weight_decay};
  return launch_multi_tensor<0b1101U>(ctx, pack, rule, counters, found_inf, "adamw_step");
}

Status launch_advance_step(const KernelContext& ctx, StepCounters* counters,
                           const GradScalerOptions* scaler, const float* found_inf) {
  advance_kernel<<<1, 1, 0, ctx.stream>>>(
      counters, scaler != nullptr ? *scaler : GradScalerOptions{}, scaler != nullptr, found_inf);
  DLPROBE_CUDA_CHECK_LAUNCH();
  return Status::ok();
}

}  // namespace dlprobe::cuda
