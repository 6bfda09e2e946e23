// The device vocabulary's parsers, value by value: what each accepts, and that a refusal names the
// value and what is accepted but never a flag (the command line adds the flag).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "dlprobe/device/backend_kind.h"
#include "dlprobe/device/conv_options.h"
#include "dlprobe/device/device.h"

namespace dlprobe::device {
namespace {

void expect_plain_error(const Status& status, const std::string& needle, std::string_view text) {
  EXPECT_FALSE(status.is_ok()) << text;
  EXPECT_NE(status.message().find(needle), std::string::npos) << text << ": " << status.message();
  EXPECT_EQ(status.message().find("--"), std::string::npos) << text << ": " << status.message();
}

TEST(ParseDevice, EachValue) {
  struct Case {
    std::string text;
    std::optional<Device> want;  // nullopt: refused
  };
  const Case cases[] = {
      {"cpu", Device{DeviceKind::cpu, 0}},
      {"cuda", Device{DeviceKind::cuda, 0}},
      {"cuda:0", Device{DeviceKind::cuda, 0}},
      {"cuda:3", Device{DeviceKind::cuda, 3}},
      {"cuda:12", Device{DeviceKind::cuda, 12}},
      {"", std::nullopt},
      {"CPU", std::nullopt},
      {"cpu:0", std::nullopt},
      {"cpu:onednn", std::nullopt},
      {" cpu", std::nullopt},
      {"gpu", std::nullopt},
      {"tpu:0", std::nullopt},
      {"cuda:", std::nullopt},
      {"cuda:-1", std::nullopt},
      {"cuda:x", std::nullopt},
      {"cuda:1x", std::nullopt},
      {"cuda0", std::nullopt},
  };
  for (const Case& c : cases) {
    const Result<Device> got = parse_device(c.text);
    if (c.want) {
      ASSERT_TRUE(got.has_value()) << c.text << ": " << got.status().message();
      EXPECT_EQ(got->kind, c.want->kind) << c.text;
      EXPECT_EQ(got->index, c.want->index) << c.text;
    } else {
      expect_plain_error(got.status(),
                         "unknown device '" + c.text + "' (expected cpu, cuda or cuda:N)", c.text);
    }
  }
}

TEST(ParseDevice, NamesReadBack) {
  for (const Device d :
       {Device{DeviceKind::cpu, 0}, Device{DeviceKind::cuda, 0}, Device{DeviceKind::cuda, 7}}) {
    const Result<Device> back = parse_device(device_name(d));
    ASSERT_TRUE(back.has_value()) << device_name(d);
    EXPECT_EQ(back->kind, d.kind);
    EXPECT_EQ(back->index, d.index);
  }
  EXPECT_EQ(device_name({DeviceKind::cuda, 2}), "cuda:2");
  EXPECT_EQ(device_name({}), "cpu");
}

TEST(ParseBackend, EachValueOnEachDevice) {
  const Device cpu{DeviceKind::cpu, 0};
  const Device gpu{DeviceKind::cuda, 1};
  const bool onednn = backend_built(BackendKind::onednn);
  const bool cuda = backend_built(BackendKind::cuda);
  struct Case {
    std::string text;
    Device device;
    std::optional<BackendKind> want;  // nullopt: refused with `error` and `code`
    std::string error;
    Errc code = Errc::ok;
  };
  const std::string wrong_device = "does not run on";
  const Case cases[] = {
      // The CPU runs oneDNN unless the reference loops are named.
      {"auto", cpu, onednn ? BackendKind::onednn : BackendKind::reference, "", Errc::ok},
      {"reference", cpu, BackendKind::reference, "", Errc::ok},
      {"onednn", cpu, onednn ? std::optional(BackendKind::onednn) : std::nullopt,
       "this build has no onednn backend (configured without DLPROBE_WITH_ONEDNN)",
       Errc::unavailable},
      {"cuda", cpu, std::nullopt, "backend cuda does not run on cpu", Errc::invalid_argument},
      {"auto", gpu, cuda ? std::optional(BackendKind::cuda) : std::nullopt,
       "cuda:1: this build has no cuda backend (configured without DLPROBE_WITH_CUDA)",
       Errc::unavailable},
      {"cuda", gpu, cuda ? std::optional(BackendKind::cuda) : std::nullopt, "no cuda backend",
       Errc::unavailable},
      {"onednn", gpu, std::nullopt, "backend onednn does not run on cuda:1",
       Errc::invalid_argument},
      {"reference", gpu, std::nullopt, "backend reference does not run on cuda:1",
       Errc::invalid_argument},
      {"tpu", cpu, std::nullopt, "unknown backend 'tpu' (expected auto, cuda, onednn or reference)",
       Errc::invalid_argument},
      {"", gpu, std::nullopt, "unknown backend ''", Errc::invalid_argument},
      {"Auto", cpu, std::nullopt, "unknown backend 'Auto'", Errc::invalid_argument},
  };
  for (const Case& c : cases) {
    const std::string what = c.text + " on " + device_name(c.device);
    const Result<BackendKind> got = parse_backend(c.text, c.device);
    if (c.want) {
      ASSERT_TRUE(got.has_value()) << what << ": " << got.status().message();
      EXPECT_EQ(*got, *c.want) << what;
    } else {
      expect_plain_error(got.status(), c.error, what);
      EXPECT_EQ(got.status().code(), c.code) << what;
    }
  }
  EXPECT_EQ(default_backend(gpu), BackendKind::cuda);
  EXPECT_EQ(default_backend(cpu), onednn ? BackendKind::onednn : BackendKind::reference);
  EXPECT_TRUE(backend_built(BackendKind::reference));
}

TEST(BackendSupports, EachPrecisionOnEachBackend) {
  using engine::Precision;
  struct Case {
    BackendKind kind;
    Precision precision;
    std::string refusal;  // empty: runs
  };
  const Case cases[] = {
      {BackendKind::reference, Precision::fp32, ""},
      {BackendKind::reference, Precision::fp16, ""},
      {BackendKind::reference, Precision::bf16, ""},
      {BackendKind::reference, Precision::fp64, ""},
      {BackendKind::reference, Precision::tf32, "tf32 is a GPU tensor-core mode"},
      {BackendKind::onednn, Precision::fp32, ""},
      {BackendKind::onednn, Precision::bf16, ""},
      {BackendKind::onednn, Precision::fp16, "fp16 is not on the oneDNN CPU backend"},
      {BackendKind::onednn, Precision::tf32, "tf32 is a GPU tensor-core mode"},
      {BackendKind::onednn, Precision::fp64, "fp64 runs on the reference backend (cpu) only"},
      {BackendKind::cuda, Precision::fp32, ""},
      {BackendKind::cuda, Precision::tf32, ""},
      {BackendKind::cuda, Precision::fp16, ""},
      {BackendKind::cuda, Precision::bf16, ""},
      {BackendKind::cuda, Precision::fp64, "fp64 runs on the reference backend (cpu) only"},
  };
  for (const Case& c : cases) {
    const std::string what = std::string(backend_kind_name(c.kind)) + " " +
                             std::string(engine::precision_name(c.precision));
    const Status s = backend_supports(c.kind, c.precision);
    if (c.refusal.empty()) {
      EXPECT_TRUE(s.is_ok()) << what << ": " << s.message();
    } else {
      expect_plain_error(s, c.refusal, what);
      EXPECT_EQ(s.code(), Errc::unsupported) << what;
    }
  }
}

TEST(ParseConvOptions, EachValue) {
  EXPECT_EQ(*parse_conv_engines("any"), ConvEngines::any);
  EXPECT_EQ(*parse_conv_engines("deterministic"), ConvEngines::deterministic);
  EXPECT_EQ(*parse_conv_engines("exact"), ConvEngines::exact);
  for (const std::string bad : {"", "fft", "Any", "exact "}) {
    expect_plain_error(parse_conv_engines(bad).status(),
                       "unknown choice '" + bad + "' (expected any, deterministic or exact)", bad);
  }
  EXPECT_EQ(*parse_conv_algo("heuristic"), ConvEngineChoice::heuristic);
  EXPECT_EQ(*parse_conv_algo("autotune"), ConvEngineChoice::autotune);
  EXPECT_EQ(*parse_conv_algo("exhaustive"), ConvEngineChoice::exhaustive);
  for (const std::string bad : {"", "fastest", "benchmark"}) {
    expect_plain_error(parse_conv_algo(bad).status(),
                       "unknown choice '" + bad + "' (expected heuristic, autotune or exhaustive)",
                       bad);
  }
  EXPECT_EQ(*parse_conv_sums("epilogue"), ConvSumsBy::epilogue);
  EXPECT_EQ(*parse_conv_sums("pass"), ConvSumsBy::pass);
  // `auto`: cuDNN's epilogue in fp16 only, and the default.
  EXPECT_EQ(*parse_conv_sums("auto"), ConvSumsBy::epilogue_in_fp16);
  EXPECT_EQ(ConvOptions{}.sums, ConvSumsBy::epilogue_in_fp16);
  EXPECT_EQ(parse_conv_prologue("fused")->mode, ConvPrologue::fused);
  EXPECT_EQ(parse_conv_prologue("pass")->mode, ConvPrologue::pass);
  EXPECT_EQ(parse_conv_prologue("auto")->mode, ConvPrologue::automatic);
  EXPECT_EQ(parse_conv_prologue("timed")->mode, ConvPrologue::timed);
  const auto up_to = parse_conv_prologue("up-to:13MB");
  ASSERT_TRUE(up_to.has_value()) << up_to.status().message();
  EXPECT_EQ(up_to->mode, ConvPrologue::up_to);
  EXPECT_EQ(up_to->up_to_bytes, 13'000'000U);
  EXPECT_EQ(parse_conv_prologue("up-to:2MiB")->up_to_bytes, 2U << 20);
  for (const std::string bad : {"", "cudnn", "apart", "Auto", "up-to", "upto:1MB"}) {
    expect_plain_error(
        parse_conv_prologue(bad).status(),
        "unknown choice '" + bad + "' (expected fused, pass, auto, timed or up-to:SIZE)", bad);
  }
  for (const std::string bad : {"up-to:", "up-to:big", "up-to:-1MB"}) {
    const auto refused = parse_conv_prologue(bad);
    ASSERT_FALSE(refused.has_value()) << bad;
    EXPECT_NE(refused.status().message().find("up-to"), std::string::npos)
        << refused.status().message();
  }
  for (const std::string bad : {"", "cudnn", "Pass"}) {
    expect_plain_error(parse_conv_sums(bad).status(),
                       "unknown choice '" + bad + "' (expected epilogue, pass or auto)", bad);
  }
}

// What each --conv-prologue choice asks of the CUDA backend; `auto` is the size rule up to its
// batch and the timed routes above it.
TEST(ConvPrologueRoutes, EachChoiceItsRoutes) {
  const auto routes = [](std::string_view text) {
    // Set beforehand, so that a choice which leaves a field alone shows.
    CudaBackendOptions cuda;
    cuda.conv_prologue_pass = true;
    cuda.conv_prologue_timed = true;
    cuda.conv_prologue_pass_up_to_bytes = 1;
    cuda.conv_prologue_size_rule_up_to_batch = 1;
    set_prologue_routes(*parse_conv_prologue(text), cuda);
    return cuda;
  };
  const CudaBackendOptions fused = routes("fused");
  EXPECT_FALSE(fused.conv_prologue_pass || fused.conv_prologue_timed ||
               fused.conv_prologue_pass_up_to_bytes || fused.conv_prologue_size_rule_up_to_batch);
  const CudaBackendOptions pass = routes("pass");
  EXPECT_TRUE(pass.conv_prologue_pass);
  EXPECT_FALSE(pass.conv_prologue_timed || pass.conv_prologue_pass_up_to_bytes ||
               pass.conv_prologue_size_rule_up_to_batch);
  const CudaBackendOptions timed = routes("timed");
  EXPECT_TRUE(timed.conv_prologue_timed);
  EXPECT_FALSE(timed.conv_prologue_pass || timed.conv_prologue_pass_up_to_bytes ||
               timed.conv_prologue_size_rule_up_to_batch);
  const CudaBackendOptions up_to = routes("up-to:2MiB");
  EXPECT_EQ(up_to.conv_prologue_pass_up_to_bytes, std::optional<std::uint64_t>(2U << 20));
  EXPECT_FALSE(up_to.conv_prologue_pass || up_to.conv_prologue_timed ||
               up_to.conv_prologue_size_rule_up_to_batch);
  const CudaBackendOptions automatic = routes("auto");
  EXPECT_TRUE(automatic.conv_prologue_timed);
  EXPECT_FALSE(automatic.conv_prologue_pass);
  EXPECT_EQ(automatic.conv_prologue_pass_up_to_bytes, std::optional<std::uint64_t>(13'000'000U));
  EXPECT_EQ(automatic.conv_prologue_size_rule_up_to_batch, std::optional<std::int64_t>(128));
}

}  // namespace
}  // namespace dlprobe::device
