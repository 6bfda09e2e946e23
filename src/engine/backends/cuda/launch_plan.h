// Host-side planning for the CUDA kernels, kept free of CUDA so the CPU tests can check it: how
// the multi-tensor kernels see their tensors (one table of slots and fixed-size chunks, uploaded
// once per launch) and how the per-channel reductions split their work across blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace dlprobe::cuda {

// One tensor group of a multi-tensor launch: up to four arrays of `numel` fp32 elements (param,
// grad, state0, state1 for the optimizers; only ptr[0] for unscaling), null where unused. The
// layout is shared by the host packer and the kernels, so it is plain data of fixed size.
struct PackedTensors {
  void* ptr[4] = {nullptr, nullptr, nullptr, nullptr};
  std::int64_t numel = 0;
  // Every non-null array is 16-byte aligned, so the kernel may move float4s.
  std::int64_t vectorizable = 0;
};
// A contiguous range of one group's elements that one block works through.
struct PackedChunk {
  std::int64_t tensor = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};
static_assert(sizeof(PackedTensors) == 48 && sizeof(PackedChunk) == 24);

// The table a multi-tensor kernel reads: the groups, then the chunks, in one buffer.
struct MultiTensorPack {
  std::vector<PackedTensors> tensors;
  std::vector<PackedChunk> chunks;

  std::size_t chunk_offset() const { return tensors.size() * sizeof(PackedTensors); }
  std::size_t bytes() const { return chunk_offset() + chunks.size() * sizeof(PackedChunk); }
  // Serialises into `dst` of bytes() bytes.
  void write(std::byte* dst) const;
};

// Elements per chunk: a multiple of 4 so that every chunk of an aligned group starts on a float4.
inline constexpr std::int64_t kMultiTensorChunk = 32768;

// Splits every group into chunks of at most `chunk` elements (a multiple of 4), in order.
MultiTensorPack pack_multi_tensor(std::span<const PackedTensors> tensors,
                                  std::int64_t chunk = kMultiTensorChunk);

// How a per-channel reduction over `rows` elements per channel is split: `splits` blocks per
// channel tile, each covering `rows_per_split` consecutive elements (the last one fewer). The
// partial results are merged per channel afterwards in split order, so the sum is deterministic.
struct ChannelReducePlan {
  std::int64_t splits = 1;
  std::int64_t rows_per_split = 0;
};
// `tiles`: blocks a single split needs across the channels. Aims at `blocks` blocks in all (those
// the GPU runs at once: one wave), with at least `min_rows` elements per split so each block has
// enough work to hide latency.
ChannelReducePlan plan_channel_reduce(std::int64_t rows, std::int64_t tiles, std::int64_t blocks,
                                      std::int64_t min_rows);

// A per-channel reduction whose operands stay in registers from their load until their use after
// the reduction (one launch: load, reduce, merge across the grid, use): each thread holds `depth`
// rows of its channels, and `splits` blocks of `ty` thread rows cover a channel tile's rows.
struct ResidentPlan {
  int depth = 0;
  std::int64_t splits = 0;
};
// One depth a kernel is built for, with the blocks of it the GPU runs at once (its occupancy
// times the SMs): a grid-wide merge needs every block of the grid resident.
struct ResidentDepth {
  int depth = 0;
  std::int64_t resident_blocks = 0;
};
// The shallowest of `depths` (given shallowest first) whose grid, `tiles` by the splits it needs,
// fits at once; none when the rows are too many for every depth.
std::optional<ResidentPlan> plan_resident_reduce(std::int64_t rows, std::int64_t tiles, int ty,
                                                 std::span<const ResidentDepth> depths);

}  // namespace dlprobe::cuda
