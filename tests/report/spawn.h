// Runs a shell command line for the CLI and browser tests and collects what it printed.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dlprobe::testing {

struct Ran {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh folder under the system temp folder, unique to this process and `name`.
inline std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("dlprobe_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// `command` is passed to /bin/sh; stdout and stderr go to files in `dir`.
inline Ran run(const std::string& command, const std::filesystem::path& dir) {
  const auto out = dir / "stdout.txt";
  const auto err = dir / "stderr.txt";
  const std::string line = command + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(line.c_str());
  Ran r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

}  // namespace dlprobe::testing
