// The container a run is in, when it can tell: the runtime, and the image's name and digest where
// something says them. A new image (a rebuilt NGC container, a new tag) changes the libraries
// under a measurement as a new driver does, so the results' context records it and the history
// names it among what changed.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "dlprobe/results/results.h"

namespace dlprobe::doctor {

// The value of an environment variable, nullopt when unset (std::getenv on this machine).
using Environment = std::function<std::optional<std::string>(const std::string& name)>;

// The container under `root` ("/" on this machine) with environment `env`, nullopt when nothing
// says this is one. The runtime, most specific first: kubernetes (KUBERNETES_SERVICE_HOST, or
// "kubepods" in proc/1/cgroup), podman (run/.containerenv, or "libpod" in the cgroup), docker
// (.dockerenv, or "docker" in the cgroup), containerd (the cgroup). The image: DLPROBE_IMAGE and
// DLPROBE_IMAGE_DIGEST (set by the user's Dockerfile) first, else podman's run/.containerenv
// (image=, imageid=), else the version an NVIDIA NGC image declares (NVIDIA_PYTORCH_VERSION,
// NVIDIA_TENSORFLOW_VERSION, NVIDIA_TRITON_SERVER_VERSION, with NVIDIA_BUILD_ID).
std::optional<results::Container> detect_container(const std::filesystem::path& root,
                                                   const Environment& env);

// This machine's container.
std::optional<results::Container> detect_container();

}  // namespace dlprobe::doctor
