#include "launch_plan.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace dlprobe::cuda {

void MultiTensorPack::write(std::byte* dst) const {
  if (!tensors.empty()) std::memcpy(dst, tensors.data(), chunk_offset());
  if (!chunks.empty()) {
    std::memcpy(dst + chunk_offset(), chunks.data(), chunks.size() * sizeof(PackedChunk));
  }
}

MultiTensorPack pack_multi_tensor(std::span<const PackedTensors> tensors, std::int64_t chunk) {
  assert(chunk > 0 && chunk % 4 == 0);
  MultiTensorPack pack;
  pack.tensors.assign(tensors.begin(), tensors.end());
  for (std::size_t t = 0; t < pack.tensors.size(); ++t) {
    PackedTensors& group = pack.tensors[t];
    bool aligned = true;
    for (void* p : group.ptr) {
      if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 != 0) aligned = false;
    }
    group.vectorizable = aligned ? 1 : 0;
    for (std::int64_t begin = 0; begin < group.numel; begin += chunk) {
      pack.chunks.push_back(
          {static_cast<std::int64_t>(t), begin, std::min(begin + chunk, group.numel)});
    }
  }
  return pack;
}

ChannelReducePlan plan_channel_reduce(std::int64_t rows, std::int64_t tiles, std::int64_t blocks,
                                      std::int64_t min_rows) {
  assert(rows > 0 && tiles > 0 && blocks > 0 && min_rows > 0);
  const std::int64_t wanted = (blocks + tiles - 1) / tiles;
  const std::int64_t most = std::max<std::int64_t>(1, rows / min_rows);
  // grid.y carries the splits and is limited to 65535.
  std::int64_t splits = std::clamp<std::int64_t>(wanted, 1, std::min<std::int64_t>(most, 65535));
  const std::int64_t per = (rows + splits - 1) / splits;
  // Recount so that no split is empty: 5 rows wanted in 4 splits gives 2 rows per split, which
  // needs only 3 splits.
  splits = (rows + per - 1) / per;
  return {splits, per};
}

std::optional<ResidentPlan> plan_resident_reduce(std::int64_t rows, std::int64_t tiles, int ty,
                                                 std::span<const ResidentDepth> depths) {
  assert(rows > 0 && tiles > 0 && ty > 0);
  for (const ResidentDepth& d : depths) {
    const std::int64_t per_block = static_cast<std::int64_t>(ty) * d.depth;
    const std::int64_t splits = (rows + per_block - 1) / per_block;
    if (splits <= 65535 && tiles * splits <= d.resident_blocks)
      return ResidentPlan{d.depth, splits};
  }
  return std::nullopt;
}

}  // namespace dlprobe::cuda
