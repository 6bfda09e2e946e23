// The Backend base class's defaults, which the synchronous backends (reference, cpu) run on:
// timing marks on the host clock, waiting for a mark, and no graph capture.
#include <gtest/gtest.h>

#include "dlprobe/engine/reference_backend.h"

namespace dlprobe {
namespace {

TEST(BackendDefaults, MarksTimeAndWaitOnlyOnceRecorded) {
  auto made = make_reference_backend();
  ASSERT_TRUE(made.has_value()) << made.status().message();
  Backend& b = **made;
  EXPECT_FALSE(b.wait_for_mark(0).is_ok());
  EXPECT_FALSE(b.elapsed_ms(0, 1).has_value());
  ASSERT_TRUE(b.mark(0).is_ok());
  ASSERT_TRUE(b.mark(2).is_ok());
  EXPECT_TRUE(b.wait_for_mark(0).is_ok());
  EXPECT_TRUE(b.wait_for_mark(2).is_ok());
  // Index 1 lies between two recorded marks but was never recorded itself.
  const Status between = b.wait_for_mark(1);
  ASSERT_FALSE(between.is_ok());
  EXPECT_EQ(between.message(), "timing mark 1 was never recorded");
  const Result<double> ms = b.elapsed_ms(0, 2);
  ASSERT_TRUE(ms.has_value());
  EXPECT_GE(*ms, 0.0);
}

TEST(BackendDefaults, GraphsAreRefusedAndReleasingNoneIsHarmless) {
  auto made = make_reference_backend();
  ASSERT_TRUE(made.has_value());
  Backend& b = **made;
  bool ran = false;
  const Result<std::size_t> g = b.capture([&] {
    ran = true;
    return Status::ok();
  });
  EXPECT_FALSE(g.has_value());
  EXPECT_FALSE(ran);
  EXPECT_FALSE(b.replay(0).is_ok());
  b.release_graph(0);
}

}  // namespace
}  // namespace dlprobe
