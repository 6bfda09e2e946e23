// The convolution tuning cache: in memory, over a file, and what it refuses to read.
#include "dlprobe/engine/conv_tuning.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/temp_folder.h"
#include "dlprobe/core/files.h"

namespace dlprobe {
namespace {

class ConvTuningTest : public ::testing::Test {
 protected:
  std::filesystem::path file() const { return dir_ / "tuning.json"; }
  void write(const std::string& text) const { ASSERT_TRUE(write_file_atomic(file(), text)); }
  std::string parse_error() const {
    auto c = ConvTuningCache::open(file());
    EXPECT_FALSE(c.has_value());
    return c.has_value() ? std::string() : c.status().message();
  }
  testing::TempFolder dir_;
};

const ConvTuningEntry kEntry{42,    {{3, 1}, {7, 64}}, "eng42 [tensor_core] {3=1,7=64}",
                             0.125, 1 << 20,           {}};

TEST_F(ConvTuningTest, InMemoryFindsWhatWasRecorded) {
  ConvTuningCache cache;
  EXPECT_FALSE(cache.find("k").has_value());
  ASSERT_TRUE(cache.record("k", kEntry).is_ok());
  auto e = cache.find("k");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->engine, 42);
  EXPECT_EQ(e->label, kEntry.label);
  EXPECT_EQ(cache.size(), 1U);
  EXPECT_FALSE(cache.path().has_value());
  cache.forget("k");
  EXPECT_FALSE(cache.find("k").has_value());
}

TEST_F(ConvTuningTest, FileKeepsEveryRecordForTheNextProcess) {
  auto first = ConvTuningCache::open(file());
  ASSERT_TRUE(first.has_value()) << first.status().message();
  EXPECT_EQ((*first)->size(), 0U);
  EXPECT_TRUE(std::filesystem::exists(file()));  // created empty at once
  ASSERT_TRUE((*first)->record("H200 sm_90 | autotune | conv0 a", kEntry).is_ok());
  ASSERT_TRUE(
      (*first)->record("H200 sm_90 | autotune | conv1 b", {7, {}, "eng7 []", 2.5, 0, {}}).is_ok());
  auto second = ConvTuningCache::open(file());
  ASSERT_TRUE(second.has_value()) << second.status().message();
  EXPECT_EQ((*second)->size(), 2U);
  auto e = (*second)->find("H200 sm_90 | autotune | conv1 b");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->engine, 7);
  EXPECT_DOUBLE_EQ(e->ms, 2.5);
  EXPECT_EQ(e->workspace_bytes, 0);
}

TEST_F(ConvTuningTest, SerializeAndParseRoundTrip) {
  // A fused graph's entry carries cuDNN's serialized plan, JSON text of its own.
  const std::string plan = R"({"engine": 5, "kernel": "\u0001binary\"quoted\""})";
  const std::map<std::string, ConvTuningEntry> entries{{"a \"quoted\" key", kEntry},
                                                       {"b", {0, {}, "", 0.0, 0, {}}},
                                                       {"fused", {5, {}, "", 0, 0, plan}}};
  auto back = ConvTuningCache::parse(ConvTuningCache::serialize(entries), "x");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  ASSERT_EQ(back->size(), 3U);
  EXPECT_EQ(back->at("a \"quoted\" key").engine, 42);
  EXPECT_EQ(back->at("a \"quoted\" key").workspace_bytes, 1 << 20);
  EXPECT_EQ(back->at("a \"quoted\" key").knobs, kEntry.knobs);
  EXPECT_TRUE(back->at("b").knobs.empty());
  EXPECT_EQ(back->at("b").engine, 0);
  EXPECT_TRUE(back->at("b").plan.empty());
  EXPECT_EQ(back->at("fused").plan, plan);
}

// The kept plans only save start-up time: a file that would grow past what open() reads drops
// them, keeps the engine choices, and opens again.
TEST_F(ConvTuningTest, PlansAreDroppedBeforeTheFileOutgrowsItsBound) {
  auto cache = ConvTuningCache::open(file());
  ASSERT_TRUE(cache.has_value()) << cache.status().message();
  ASSERT_TRUE((*cache)->record("plain", kEntry).is_ok());
  ConvTuningEntry fused{5, {}, "eng5 []", 0, 0, std::string(65U << 20, 'p')};
  ASSERT_TRUE((*cache)->record("fused", fused).is_ok());
  auto again = ConvTuningCache::open(file());
  ASSERT_TRUE(again.has_value()) << again.status().message();
  ASSERT_TRUE((*again)->find("fused").has_value());
  EXPECT_TRUE((*again)->find("fused")->plan.empty());
  EXPECT_EQ((*again)->find("fused")->engine, 5);
  EXPECT_EQ((*again)->find("plain")->engine, 42);
  EXPECT_TRUE((*cache)->find("fused")->plan.empty());  // and in memory, as in the file
}

TEST_F(ConvTuningTest, FilesThatAreNotACacheAreOneLineErrorsNamingTheFile) {
  const std::pair<std::string, const char*> cases[] = {
      {"{not json", "invalid JSON"},
      {"[]", "schema"},
      // Nested past the bound, it is refused as the parser reaches the bound, not built.
      {"{\"schema\": " + std::string(200, '[') + std::string(200, ']') + "}",
       "nested deeper than 128 levels"},
      {R"({"schema": "dlprobe.conv-tuning", "schema": "dlprobe.conv-tuning"})",
       "schema: the key is given twice"},
      {R"({"schema": "dlprobe.results", "version": 1, "entries": {}})", "schema"},
      {R"({"schema": "dlprobe.conv-tuning", "version": 1, "entries": {}})", "version 2"},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2})", "entries"},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2, "entries": {"k": {"engine": -1,
         "knobs": [], "label": "", "ms": 1, "workspace_bytes": 0}}})",
       "entry \"k\""},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2, "entries": {"k": {"engine": 1,
         "knobs": [[1]], "label": "", "ms": 1, "workspace_bytes": 0}}})",
       "knobs as [type, value] pairs"},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2, "entries": {"k": {"engine": 3}}})",
       "entry \"k\""},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2, "entries": {"k": {"engine": 1,
         "knobs": [], "label": "", "ms": -1e308, "workspace_bytes": 0}}})",
       "ms >= 0"},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2, "entries": {"k": {"engine": 1,
         "knobs": [[1, 18446744073709551615]], "label": "", "ms": 1, "workspace_bytes": 0}}})",
       "knobs as [type, value] pairs"},
      {R"({"schema": "dlprobe.conv-tuning", "version": 2, "entries": {"k": {"engine": 1,
         "knobs": [], "label": "", "ms": 1, "workspace_bytes": 0, "plan": {}}}})",
       "a plan as text"},
  };
  for (const auto& [text, expected] : cases) {
    write(text);
    const std::string message = parse_error();
    EXPECT_NE(message.find(file().string()), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << text << " -> " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// A device that never ends (a mistyped path) is refused once past any cache's size, not read
// until memory runs out.
TEST_F(ConvTuningTest, EndlessFileIsRefusedAtOpen) {
  const auto cache = ConvTuningCache::open("/dev/zero");
  ASSERT_FALSE(cache.has_value());
  EXPECT_NE(cache.status().message().find("/dev/zero"), std::string::npos)
      << cache.status().message();
}

TEST_F(ConvTuningTest, PathThatCannotBeWrittenFailsAtOpen) {
  auto cache = ConvTuningCache::open(dir_ / "missing-folder" / "tuning.json");
  ASSERT_FALSE(cache.has_value());
  EXPECT_NE(cache.status().message().find("missing-folder"), std::string::npos);
}

TEST_F(ConvTuningTest, FailedRewriteKeepsTheChoiceInMemoryAndSaysWhy) {
  auto cache = ConvTuningCache::open(file());
  ASSERT_TRUE(cache.has_value()) << cache.status().message();
  std::filesystem::remove_all(
      dir_.path());  // the folder goes: the rewrite cannot create its temporary
  const Status s = (*cache)->record("k", kEntry);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("tuning cache"), std::string::npos) << s.message();
  EXPECT_TRUE((*cache)->find("k").has_value());
}

}  // namespace
}  // namespace dlprobe
