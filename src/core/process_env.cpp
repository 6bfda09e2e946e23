#include "dlprobe/core/process_env.h"

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace dlprobe {

namespace {

std::mutex& names_mutex() {
  static std::mutex mu;
  return mu;
}
std::set<std::string, std::less<>>& names() {
  static std::set<std::string, std::less<>> set;
  return set;
}

}  // namespace

bool set_default_env(std::string_view name, std::string_view value) {
  const std::string key(name);
  std::lock_guard lock(names_mutex());
  if (std::getenv(key.c_str()) != nullptr) return false;
  if (setenv(key.c_str(), std::string(value).c_str(), 0) != 0) return false;
  names().insert(key);
  return true;
}

bool set_by_dlprobe(std::string_view name) {
  std::lock_guard lock(names_mutex());
  return names().contains(name);
}

}  // namespace dlprobe
