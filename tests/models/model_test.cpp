#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "dlprobe/models/resnet.h"

namespace dlprobe::model {
namespace {

Model make(Arch arch, std::int64_t image = 224, std::int64_t classes = 1000) {
  Result<Model> m = Model::create({arch, image, classes, false});
  EXPECT_TRUE(m.has_value()) << m.status().message();
  return std::move(m).value();
}

// sum(p.numel() for p in torchvision.models.<arch>().parameters())
TEST(ModelTest, ParameterCountsMatchTorchvision) {
  EXPECT_EQ(make(Arch::resnet18).parameter_count(), 11'689'512);
  EXPECT_EQ(make(Arch::resnet34).parameter_count(), 21'797'672);
  EXPECT_EQ(make(Arch::resnet50).parameter_count(), 25'557'032);
  EXPECT_EQ(make(Arch::resnet101).parameter_count(), 44'549'160);
  EXPECT_EQ(make(Arch::resnet152).parameter_count(), 60'192'808);
}

TEST(ModelTest, ClassCountChangesOnlyTheHead) {
  // fc: 512*10 + 10 instead of 512*1000 + 1000.
  EXPECT_EQ(make(Arch::resnet18, 32, 10).parameter_count(), 11'689'512 - 513'000 + 5'130);
}

// list(torchvision.models.resnet18().state_dict().keys())
const std::vector<std::string> kResnet18Keys = {
    "conv1.weight",
    "bn1.weight",
    "bn1.bias",
    "bn1.running_mean",
    "bn1.running_var",
    "bn1.num_batches_tracked",
    "layer1.0.conv1.weight",
    "layer1.0.bn1.weight",
    "layer1.0.bn1.bias",
    "layer1.0.bn1.running_mean",
    "layer1.0.bn1.running_var",
    "layer1.0.bn1.num_batches_tracked",
    "layer1.0.conv2.weight",
    "layer1.0.bn2.weight",
    "layer1.0.bn2.bias",
    "layer1.0.bn2.running_mean",
    "layer1.0.bn2.running_var",
    "layer1.0.bn2.num_batches_tracked",
    "layer1.1.conv1.weight",
    "layer1.1.bn1.weight",
    "layer1.1.bn1.bias",
    "layer1.1.bn1.running_mean",
    "layer1.1.bn1.running_var",
    "layer1.1.bn1.num_batches_tracked",
    "layer1.1.conv2.weight",
    "layer1.1.bn2.weight",
    "layer1.1.bn2.bias",
    "layer1.1.bn2.running_mean",
    "layer1.1.bn2.running_var",
    "layer1.1.bn2.num_batches_tracked",
    "layer2.0.conv1.weight",
    "layer2.0.bn1.weight",
    "layer2.0.bn1.bias",
    "layer2.0.bn1.running_mean",
    "layer2.0.bn1.running_var",
    "layer2.0.bn1.num_batches_tracked",
    "layer2.0.conv2.weight",
    "layer2.0.bn2.weight",
    "layer2.0.bn2.bias",
    "layer2.0.bn2.running_mean",
    "layer2.0.bn2.running_var",
    "layer2.0.bn2.num_batches_tracked",
    "layer2.0.downsample.0.weight",
    "layer2.0.downsample.1.weight",
    "layer2.0.downsample.1.bias",
    "layer2.0.downsample.1.running_mean",
    "layer2.0.downsample.1.running_var",
    "layer2.0.downsample.1.num_batches_tracked",
    "layer2.1.conv1.weight",
    "layer2.1.bn1.weight",
    "layer2.1.bn1.bias",
    "layer2.1.bn1.running_mean",
    "layer2.1.bn1.running_var",
    "layer2.1.bn1.num_batches_tracked",
    "layer2.1.conv2.weight",
    "layer2.1.bn2.weight",
    "layer2.1.bn2.bias",
    "layer2.1.bn2.running_mean",
    "layer2.1.bn2.running_var",
    "layer2.1.bn2.num_batches_tracked",
    "layer3.0.conv1.weight",
    "layer3.0.bn1.weight",
    "layer3.0.bn1.bias",
    "layer3.0.bn1.running_mean",
    "layer3.0.bn1.running_var",
    "layer3.0.bn1.num_batches_tracked",
    "layer3.0.conv2.weight",
    "layer3.0.bn2.weight",
    "layer3.0.bn2.bias",
    "layer3.0.bn2.running_mean",
    "layer3.0.bn2.running_var",
    "layer3.0.bn2.num_batches_tracked",
    "layer3.0.downsample.0.weight",
    "layer3.0.downsample.1.weight",
    "layer3.0.downsample.1.bias",
    "layer3.0.downsample.1.running_mean",
    "layer3.0.downsample.1.running_var",
    "layer3.0.downsample.1.num_batches_tracked",
    "layer3.1.conv1.weight",
    "layer3.1.bn1.weight",
    "layer3.1.bn1.bias",
    "layer3.1.bn1.running_mean",
    "layer3.1.bn1.running_var",
    "layer3.1.bn1.num_batches_tracked",
    "layer3.1.conv2.weight",
    "layer3.1.bn2.weight",
    "layer3.1.bn2.bias",
    "layer3.1.bn2.running_mean",
    "layer3.1.bn2.running_var",
    "layer3.1.bn2.num_batches_tracked",
    "layer4.0.conv1.weight",
    "layer4.0.bn1.weight",
    "layer4.0.bn1.bias",
    "layer4.0.bn1.running_mean",
    "layer4.0.bn1.running_var",
    "layer4.0.bn1.num_batches_tracked",
    "layer4.0.conv2.weight",
    "layer4.0.bn2.weight",
    "layer4.0.bn2.bias",
    "layer4.0.bn2.running_mean",
    "layer4.0.bn2.running_var",
    "layer4.0.bn2.num_batches_tracked",
    "layer4.0.downsample.0.weight",
    "layer4.0.downsample.1.weight",
    "layer4.0.downsample.1.bias",
    "layer4.0.downsample.1.running_mean",
    "layer4.0.downsample.1.running_var",
    "layer4.0.downsample.1.num_batches_tracked",
    "layer4.1.conv1.weight",
    "layer4.1.bn1.weight",
    "layer4.1.bn1.bias",
    "layer4.1.bn1.running_mean",
    "layer4.1.bn1.running_var",
    "layer4.1.bn1.num_batches_tracked",
    "layer4.1.conv2.weight",
    "layer4.1.bn2.weight",
    "layer4.1.bn2.bias",
    "layer4.1.bn2.running_mean",
    "layer4.1.bn2.running_var",
    "layer4.1.bn2.num_batches_tracked",
    "fc.weight",
    "fc.bias",
};

TEST(ModelTest, Resnet18StateDictKeysMatchTorchvisionInOrder) {
  const Model m = make(Arch::resnet18);
  std::vector<std::string> names;
  for (const StateEntry& e : m.state()) names.push_back(e.name);
  EXPECT_EQ(names, kResnet18Keys);
}

TEST(ModelTest, Resnet50UsesBottlenecksWithStrideOnThe3x3AndProjectionShortcuts) {
  const Model m = make(Arch::resnet50);
  const auto shape_of = [&](const std::string& name) {
    const int i = m.find_state(name);
    EXPECT_GE(i, 0) << name;
    return i < 0 ? Shape{} : m.state()[static_cast<std::size_t>(i)].shape;
  };
  EXPECT_EQ(shape_of("layer1.0.conv1.weight"), (Shape{64, 64, 1, 1}));
  EXPECT_EQ(shape_of("layer1.0.conv3.weight"), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(shape_of("layer1.0.downsample.0.weight"), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(shape_of("layer2.0.conv2.weight"), (Shape{128, 128, 3, 3}));
  EXPECT_EQ(shape_of("layer4.2.bn3.running_var"), (Shape{2048}));
  EXPECT_EQ(shape_of("fc.weight"), (Shape{1000, 2048}));
  EXPECT_LT(m.find_state("layer1.1.downsample.0.weight"), 0);
  int checked = 0;
  for (const Layer& l : m.layers()) {
    if (l.name == "layer2.0.conv1") {
      EXPECT_EQ(l.conv.stride[0], 1);
      ++checked;
    }
    if (l.name == "layer2.0.conv2") {
      EXPECT_EQ(l.conv.stride[0], 2);
      ++checked;
    }
    if (l.name == "layer2.0.downsample.0") {
      EXPECT_EQ(l.conv.stride[0], 2);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
}

TEST(ModelTest, ValueShapesFollowTheStemAndStages) {
  const Model m = make(Arch::resnet50);
  Result<std::vector<Shape>> shapes = m.value_shapes(2, true);
  ASSERT_TRUE(shapes.has_value()) << shapes.status().message();
  int checked = 0;
  for (const Layer& l : m.layers()) {
    const Shape& y = (*shapes)[static_cast<std::size_t>(l.output)];
    if (l.name == "conv1") {
      EXPECT_EQ(y, (Shape{2, 64, 112, 112}));
      ++checked;
    }
    if (l.name == "maxpool") {
      EXPECT_EQ(y, (Shape{2, 64, 56, 56}));
      ++checked;
    }
    if (l.name == "layer4.2.relu3") {
      EXPECT_EQ(y, (Shape{2, 2048, 7, 7}));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3);
  EXPECT_EQ((*shapes)[static_cast<std::size_t>(m.logits())], (Shape{2, 1000}));
}

TEST(ModelTest, RefusesImagesAndBatchesItCannotTake) {
  EXPECT_FALSE(Model::create({Arch::resnet18, 0, 10, false}).has_value());
  EXPECT_FALSE(Model::create({Arch::resnet18, 32, 0, false}).has_value());
  const Model m = make(Arch::resnet18, 16, 10);
  // At 16x16 layer3 and layer4 are 1x1: one image gives batch norm one value per channel.
  const Result<std::vector<Shape>> one = m.value_shapes(1, true);
  ASSERT_FALSE(one.has_value());
  EXPECT_NE(one.status().message().find("layer3.0.bn1"), std::string::npos)
      << one.status().message();
  EXPECT_TRUE(m.value_shapes(1, false).has_value());
  EXPECT_TRUE(m.value_shapes(2, true).has_value());
  EXPECT_FALSE(m.value_shapes(0, false).has_value());
  // Sizes past 64 bits would wrap around to "0 values per channel"; the overflow is named.
  const Model wide = make(Arch::resnet18, 1 << 16, 10);
  const Result<std::vector<Shape>> huge = wide.value_shapes(1LL << 40, true);
  ASSERT_FALSE(huge.has_value());
  EXPECT_NE(huge.status().message().find("overflows 64 bits"), std::string::npos)
      << huge.status().message();
}

TEST(ModelTest, ParseArch) {
  EXPECT_EQ(parse_arch("resnet101").value(), Arch::resnet101);
  const Result<Arch> bad = parse_arch("resnet51", "--model");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("--model"), std::string::npos);
}

double mean_of(const HostTensor& t) {
  double s = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) s += t.get(i);
  return s / static_cast<double>(t.numel());
}
double std_of(const HostTensor& t) {
  const double m = mean_of(t);
  double s = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) s += (t.get(i) - m) * (t.get(i) - m);
  return std::sqrt(s / static_cast<double>(t.numel()));
}

TEST(ModelTest, InitialisationFollowsTorchvisionsDistributions) {
  const Model m = make(Arch::resnet18);
  const std::vector<HostTensor> init = initial_state(m, 42);
  ASSERT_EQ(init.size(), m.state().size());
  const auto at = [&](const std::string& name) -> const HostTensor& {
    return init[static_cast<std::size_t>(m.find_state(name))];
  };
  // kaiming_normal_(fan_out, relu): std sqrt(2 / (K*R*S)).
  const HostTensor& w = at("layer3.0.conv2.weight");  // [256, 256, 3, 3]
  const double want_std = std::sqrt(2.0 / (256 * 9));
  EXPECT_NEAR(mean_of(w), 0.0, 0.01 * want_std);
  EXPECT_NEAR(std_of(w), want_std, 0.01 * want_std);
  // nn.Linear: U(-1/sqrt(512), 1/sqrt(512)), whose std is bound / sqrt(3).
  const HostTensor& fc = at("fc.weight");
  const double bound = 1.0 / std::sqrt(512.0);
  EXPECT_NEAR(std_of(fc), bound / std::sqrt(3.0), 0.01 * bound);
  for (std::int64_t i = 0; i < fc.numel(); ++i) ASSERT_LE(std::abs(fc.get(i)), bound);
  const HostTensor& fcb = at("fc.bias");
  for (std::int64_t i = 0; i < fcb.numel(); ++i) ASSERT_LE(std::abs(fcb.get(i)), bound);
  EXPECT_EQ(mean_of(at("bn1.weight")), 1.0);
  EXPECT_EQ(mean_of(at("bn1.bias")), 0.0);
  EXPECT_EQ(mean_of(at("bn1.running_mean")), 0.0);
  EXPECT_EQ(mean_of(at("bn1.running_var")), 1.0);
  EXPECT_EQ(at("bn1.num_batches_tracked").dtype(), DType::int64);
  EXPECT_EQ(at("bn1.num_batches_tracked").get(0), 0.0);
  // zero_init_residual=False: the last BN of each block starts at 1 like the others.
  EXPECT_EQ(mean_of(at("layer1.0.bn2.weight")), 1.0);
}

TEST(ModelTest, InitialisationIsSeededAndDeterministic) {
  const Model m = make(Arch::resnet18, 32, 10);
  const std::vector<HostTensor> a = initial_state(m, 7);
  const std::vector<HostTensor> b = initial_state(m, 7);
  const std::vector<HostTensor> c = initial_state(m, 8);
  const auto i = static_cast<std::size_t>(m.find_state("conv1.weight"));
  EXPECT_EQ(a[i].get(0), b[i].get(0));
  EXPECT_EQ(a[i].get(100), b[i].get(100));
  EXPECT_NE(a[i].get(0), c[i].get(0));
}

// initial_state draws a large tensor on several threads; the values must still be those of one
// generator drawn through the entries in turn: SplitMix64 from the seed, two draws per normal
// value (Box-Muller), one per uniform one. A thread that started at the wrong draw fails here.
TEST(ModelTest, InitialisationIsOneSequenceOnAnyNumberOfThreads) {
  const Model m = make(Arch::resnet18);
  const std::vector<HostTensor> init = initial_state(m, 5);
  std::uint64_t state = 5;
  const auto uniform = [&state] {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  };
  for (std::size_t e = 0; e < m.state().size(); ++e) {
    const StateEntry& entry = m.state()[e];
    const std::span<const float> got =
        entry.init == Init::kaiming_normal_fan_out || entry.init == Init::linear_uniform
            ? init[e].values<float>()
            : std::span<const float>();
    for (std::size_t i = 0; i < got.size(); ++i) {
      double want = 0;
      if (entry.init == Init::kaiming_normal_fan_out) {
        const double std =
            std::sqrt(2.0 / static_cast<double>(entry.shape[0] * entry.shape[2] * entry.shape[3]));
        const double u1 = 1.0 - uniform();
        const double u2 = uniform();
        want = std * (std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
      } else {
        want = 1.0 / std::sqrt(static_cast<double>(entry.fan_in)) * (2.0 * uniform() - 1.0);
      }
      ASSERT_EQ(got[i], static_cast<float>(want)) << entry.name << " element " << i;
    }
  }
}

TEST(ModelTest, ZeroInitResidualZeroesTheLastBnOfEachBlock) {
  const Model basic = Model::create({Arch::resnet18, 224, 1000, true}).value();
  const Model bottleneck = Model::create({Arch::resnet50, 224, 1000, true}).value();
  const std::vector<HostTensor> b = initial_state(basic, 1);
  const std::vector<HostTensor> n = initial_state(bottleneck, 1);
  EXPECT_EQ(mean_of(b[static_cast<std::size_t>(basic.find_state("layer2.1.bn2.weight"))]), 0.0);
  EXPECT_EQ(mean_of(b[static_cast<std::size_t>(basic.find_state("layer2.1.bn1.weight"))]), 1.0);
  EXPECT_EQ(mean_of(n[static_cast<std::size_t>(bottleneck.find_state("layer3.4.bn3.weight"))]),
            0.0);
  EXPECT_EQ(
      mean_of(n[static_cast<std::size_t>(bottleneck.find_state("layer3.0.downsample.1.weight"))]),
      1.0);
}

}  // namespace
}  // namespace dlprobe::model
