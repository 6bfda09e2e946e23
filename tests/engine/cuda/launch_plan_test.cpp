// The host-side launch planning of the CUDA backend (no GPU needed): multi-tensor packing and the
// split of per-channel reductions.
#include "launch_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace dlprobe::cuda {
namespace {

TEST(MultiTensorPack, ChunksCoverEveryElementOnceInOrder) {
  alignas(16) static float storage[64];
  std::vector<PackedTensors> groups = {
      {{storage, storage + 4, nullptr, nullptr}, 10, 0},
      {{storage + 8, nullptr, nullptr, nullptr}, 1, 0},
      {{storage + 12, storage + 16, storage + 20, storage + 24}, 23, 0},
  };
  const MultiTensorPack pack = pack_multi_tensor(groups, 8);
  std::vector<std::int64_t> seen = {0, 0, 0};
  std::int64_t last_tensor = 0;
  for (const PackedChunk& c : pack.chunks) {
    ASSERT_GE(c.tensor, last_tensor);
    last_tensor = c.tensor;
    EXPECT_EQ(c.begin % 8, 0) << "chunks start on chunk boundaries";
    EXPECT_LT(c.begin, c.end);
    EXPECT_LE(c.end - c.begin, 8);
    EXPECT_EQ(c.begin, seen[static_cast<std::size_t>(c.tensor)]) << "no gap, no overlap";
    seen[static_cast<std::size_t>(c.tensor)] = c.end;
  }
  EXPECT_EQ(seen, (std::vector<std::int64_t>{10, 1, 23}));
  EXPECT_EQ(pack.chunks.size(), 2U + 1U + 3U);
}

TEST(MultiTensorPack, VectorizableOnlyWhenEveryArrayIsAligned) {
  alignas(16) static float storage[16];
  const std::vector<PackedTensors> groups = {
      {{storage, storage + 4, nullptr, nullptr}, 4, 0},
      {{storage, storage + 1, nullptr, nullptr}, 4, 0},
      {{storage + 2, nullptr, nullptr, nullptr}, 4, 1},  // the caller's flag is recomputed
  };
  const MultiTensorPack pack = pack_multi_tensor(groups);
  EXPECT_EQ(pack.tensors[0].vectorizable, 1);
  EXPECT_EQ(pack.tensors[1].vectorizable, 0);
  EXPECT_EQ(pack.tensors[2].vectorizable, 0);
}

TEST(MultiTensorPack, SerialisesGroupsThenChunks) {
  alignas(16) static float storage[8];
  const std::vector<PackedTensors> groups = {{{storage, nullptr, nullptr, nullptr}, 5, 0},
                                             {{storage + 4, nullptr, nullptr, nullptr}, 3, 0}};
  const MultiTensorPack pack = pack_multi_tensor(groups, 4);
  ASSERT_EQ(pack.bytes(), 2 * sizeof(PackedTensors) + 3 * sizeof(PackedChunk));
  std::vector<std::byte> bytes(pack.bytes());
  pack.write(bytes.data());
  PackedTensors second;
  std::memcpy(&second, bytes.data() + sizeof(PackedTensors), sizeof(second));
  EXPECT_EQ(second.ptr[0], storage + 4);
  EXPECT_EQ(second.numel, 3);
  PackedChunk last;
  std::memcpy(&last, bytes.data() + pack.chunk_offset() + 2 * sizeof(PackedChunk), sizeof(last));
  EXPECT_EQ(last.tensor, 1);
  EXPECT_EQ(last.begin, 0);
  EXPECT_EQ(last.end, 3);
}

TEST(ChannelReducePlan, SplitsCoverTheRowsWithoutEmptySplits) {
  for (std::int64_t rows : {1, 5, 255, 256, 6272, 3211264}) {
    for (std::int64_t tiles : {1, 2, 64, 2048}) {
      const ChannelReducePlan plan = plan_channel_reduce(rows, tiles, 4 * 132, 256);
      SCOPED_TRACE(::testing::Message() << rows << " rows, " << tiles << " tiles");
      EXPECT_GE(plan.splits, 1);
      EXPECT_LE(plan.splits, 65535);
      EXPECT_GE(plan.splits * plan.rows_per_split, rows) << "every row covered";
      EXPECT_LT((plan.splits - 1) * plan.rows_per_split, rows) << "no empty split";
      if (plan.splits > 1) {
        EXPECT_GE(plan.rows_per_split, 256) << "at least min_rows per split";
      }
    }
  }
}

TEST(ChannelReducePlan, FillsTheGpuWhenChannelsAreFew) {
  // 2 tiles, 4 blocks an SM on 132 SMs: ~264 splits, if the rows allow it; 3 an SM, ~198.
  const ChannelReducePlan many = plan_channel_reduce(1 << 22, 2, 4 * 132, 256);
  EXPECT_GE(many.splits * 2, 4 * 132);
  const ChannelReducePlan fewer = plan_channel_reduce(1 << 22, 2, 3 * 132, 256);
  EXPECT_GE(fewer.splits * 2, 3 * 132);
  EXPECT_LT(fewer.splits * 2, 4 * 132);
  // 2048 channels already give 2048 blocks: one split.
  EXPECT_EQ(plan_channel_reduce(1 << 22, 2048, 4 * 132, 256).splits, 1);
}

TEST(ResidentPlan, TakesTheShallowestDepthWhoseGridFitsAtOnce) {
  const ResidentDepth depths[] = {{4, 264}, {16, 264}};
  // 14x14x256 at batch 32, fp16: 32 packs a row, so one tile of 8 thread rows.
  const auto small = plan_resident_reduce(32 * 14 * 14, 1, 8, depths);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->depth, 4);
  EXPECT_EQ(small->splits, 196) << "6272 rows, 32 a block";
  // 56x56x64 at batch 32 (8 packs a row: 32 thread rows): 196 blocks at depth 16.
  const auto deep = plan_resident_reduce(32 * 56 * 56, 1, 32, depths);
  ASSERT_TRUE(deep.has_value());
  EXPECT_EQ(deep->depth, 16);
  EXPECT_EQ(deep->splits, 196);
  // 56x56x256 (8 thread rows): 3136 blocks at depth 4, 784 at depth 16; neither fits 264.
  EXPECT_FALSE(plan_resident_reduce(32 * 56 * 56, 1, 8, depths).has_value());
  // 7x7x2048 at batch 32, blocks of 32 packs (the kernels' widest): 8 tiles of 8 thread rows;
  // 1568 rows need 49 splits at depth 4 (392 blocks), 13 at depth 16 (104 blocks).
  const auto wide = plan_resident_reduce(32 * 7 * 7, 8, 8, depths);
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->depth, 16);
  EXPECT_EQ(wide->splits, 13);
  // Tiles multiply the grid: the same rows in 21 tiles of 13 splits no longer fit.
  EXPECT_FALSE(plan_resident_reduce(32 * 7 * 7, 21, 8, depths).has_value());
}

TEST(ResidentPlan, CoversEveryRow) {
  const ResidentDepth depths[] = {{2, 1000}, {8, 1000}};
  for (std::int64_t rows : {1, 7, 8, 9, 1000, 4000}) {
    const auto plan = plan_resident_reduce(rows, 2, 4, depths);
    ASSERT_TRUE(plan.has_value()) << rows;
    const std::int64_t per_block = 4LL * plan->depth;
    EXPECT_GE(plan->splits * per_block, rows);
    EXPECT_LT((plan->splits - 1) * per_block, rows) << "no empty split";
    EXPECT_LE(2 * plan->splits, 1000);
  }
}

}  // namespace
}  // namespace dlprobe::cuda
