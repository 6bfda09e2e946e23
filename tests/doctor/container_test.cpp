// The container a run is in, from a fake root (/.dockerenv, /run/.containerenv, /proc/1/cgroup)
// and a fake environment.
#include "dlprobe/doctor/container.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "common/temp_folder.h"

namespace dlprobe::doctor {
namespace {

class ContainerTest : public ::testing::Test {
 protected:
  void write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = root_.path() / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::optional<results::Container> detect() const {
    return detect_container(root_.path(), [this](const std::string& name) {
      auto it = env_.find(name);
      return it == env_.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  }
  testing::TempFolder root_;
  std::map<std::string, std::string> env_;
};

TEST_F(ContainerTest, NoneOnABareMachine) {
  write("proc/1/cgroup", "0::/init.scope\n");
  EXPECT_EQ(detect(), std::nullopt);
}

TEST_F(ContainerTest, DockerFromDockerenv) {
  write(".dockerenv", "");
  write("proc/1/cgroup", "0::/\n");
  EXPECT_EQ(detect(), (results::Container{"docker", "", ""}));
}

TEST_F(ContainerTest, DockerFromCgroupV1) {
  write("proc/1/cgroup", "12:memory:/docker/3f4e5d6c7b8a\n11:cpu:/docker/3f4e5d6c7b8a\n");
  EXPECT_EQ(detect()->runtime, "docker");
}

TEST_F(ContainerTest, ContainerdFromCgroup) {
  write("proc/1/cgroup", "0::/system.slice/containerd.service/abc\n");
  EXPECT_EQ(detect()->runtime, "containerd");
}

TEST_F(ContainerTest, KubernetesBeforeTheRuntimeUnderIt) {
  write(".dockerenv", "");
  env_["KUBERNETES_SERVICE_HOST"] = "10.96.0.1";
  EXPECT_EQ(detect()->runtime, "kubernetes");
  env_.clear();
  write("proc/1/cgroup", "0::/kubepods/burstable/pod1234/abcd\n");
  EXPECT_EQ(detect()->runtime, "kubernetes");
}

TEST_F(ContainerTest, PodmanImageAndDigestFromContainerenv) {
  write("run/.containerenv",
        "engine=\"podman-4.9.3\"\nname=\"train\"\nid=\"77aa\"\n"
        "image=\"nvcr.io/nvidia/pytorch:24.05-py3\"\nimageid=\"5e1f0c2d\"\nrootless=0\n");
  EXPECT_EQ(detect(),
            (results::Container{"podman", "nvcr.io/nvidia/pytorch:24.05-py3", "5e1f0c2d"}));
}

TEST_F(ContainerTest, PodmanUnprivilegedContainerenvIsEmpty) {
  write("run/.containerenv", "");
  EXPECT_EQ(detect(), (results::Container{"podman", "", ""}));
}

TEST_F(ContainerTest, NgcReleaseAndBuild) {
  write(".dockerenv", "");
  env_["NVIDIA_PYTORCH_VERSION"] = "24.05";
  env_["NVIDIA_BUILD_ID"] = "91564";
  EXPECT_EQ(detect(), (results::Container{"docker", "NGC PyTorch 24.05 (build 91564)", ""}));
  env_.erase("NVIDIA_PYTORCH_VERSION");
  env_["NVIDIA_TENSORFLOW_VERSION"] = "24.03-tf2";
  EXPECT_EQ(detect()->image, "NGC TensorFlow 24.03-tf2 (build 91564)");
}

TEST_F(ContainerTest, TheUsersImageVariablesWin) {
  write("run/.containerenv", "image=\"localhost/mine:latest\"\nimageid=\"aaaa\"\n");
  env_["NVIDIA_PYTORCH_VERSION"] = "24.05";
  env_["DLPROBE_IMAGE"] = "registry.example.com/team/train:2026-03-01";
  env_["DLPROBE_IMAGE_DIGEST"] = "sha256:0123abcd";
  EXPECT_EQ(detect(), (results::Container{"podman", "registry.example.com/team/train:2026-03-01",
                                          "sha256:0123abcd"}));
}

TEST_F(ContainerTest, AnImageNamedOutsideAnyContainerDlprobeCanTell) {
  env_["DLPROBE_IMAGE"] = "train:7";
  EXPECT_EQ(detect(), (results::Container{"", "train:7", ""}));
}

}  // namespace
}  // namespace dlprobe::doctor
