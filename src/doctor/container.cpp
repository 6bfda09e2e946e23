#include "dlprobe/doctor/container.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

namespace dlprobe::doctor {

namespace {

std::optional<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A key="value" (or key=value) line of podman's /run/.containerenv.
std::string containerenv_value(std::string_view text, std::string_view key) {
  while (!text.empty()) {
    const auto eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != '=') {
      continue;
    }
    std::string_view value = line.substr(key.size() + 1);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    return std::string(value);
  }
  return "";
}

std::string runtime_of(const std::filesystem::path& root, const Environment& env,
                       const std::optional<std::string>& containerenv) {
  const std::string cgroup = read_text(root / "proc/1/cgroup").value_or("");
  const auto in_cgroup = [&](std::string_view word) {
    return cgroup.find(word) != std::string::npos;
  };
  if (env("KUBERNETES_SERVICE_HOST") || in_cgroup("kubepods")) return "kubernetes";
  if (containerenv || in_cgroup("libpod")) return "podman";
  std::error_code ec;
  if (std::filesystem::exists(root / ".dockerenv", ec) || in_cgroup("docker")) return "docker";
  if (in_cgroup("containerd")) return "containerd";
  return "";
}

// NGC images name no image and no digest, but each declares its framework's release and its
// build: "NGC PyTorch 24.05 (build 91564)".
std::string ngc_image(const Environment& env) {
  constexpr std::pair<const char*, const char*> kReleases[] = {
      {"NVIDIA_PYTORCH_VERSION", "PyTorch"},
      {"NVIDIA_TENSORFLOW_VERSION", "TensorFlow"},
      {"NVIDIA_TRITON_SERVER_VERSION", "Triton"}};
  for (const auto& [variable, name] : kReleases) {
    if (auto release = env(variable); release && !release->empty()) {
      std::string image = fmt::format("NGC {} {}", name, *release);
      if (auto build = env("NVIDIA_BUILD_ID"); build && !build->empty()) {
        image += fmt::format(" (build {})", *build);
      }
      return image;
    }
  }
  return "";
}

}  // namespace

std::optional<results::Container> detect_container(const std::filesystem::path& root,
                                                   const Environment& env) {
  const std::optional<std::string> containerenv = read_text(root / "run/.containerenv");
  results::Container c;
  c.runtime = runtime_of(root, env, containerenv);
  const auto set = [&](const char* name) { return env(name).value_or(""); };
  c.image = set("DLPROBE_IMAGE");
  c.digest = set("DLPROBE_IMAGE_DIGEST");
  if (c.image.empty() && c.digest.empty() && containerenv) {
    c.image = containerenv_value(*containerenv, "image");
    c.digest = containerenv_value(*containerenv, "imageid");
  }
  if (c.image.empty() && c.digest.empty()) {
    c.image = ngc_image(env);
  }
  if (c.runtime.empty() && c.image.empty() && c.digest.empty()) return std::nullopt;
  return c;
}

std::optional<results::Container> detect_container() {
  return detect_container("/", [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace dlprobe::doctor
