// The images a data pipeline reads: an ImageFolder tree (one subfolder per class, classes in sorted
// order, a class's label its index in that order) or a flat folder of JPEG files (every label 0).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"

namespace dlprobe::data {

struct Sample {
  std::filesystem::path path;
  int label = 0;
};

struct Dataset {
  std::filesystem::path root;
  std::vector<std::string> classes;  // empty for a flat folder
  std::vector<Sample> samples;       // class by class, each class's files in sorted order
};

// Whether `path` names a JPEG by its extension (.jpg, .jpeg, any case), as torchvision's
// ImageFolder picks its files.
bool is_jpeg_name(const std::filesystem::path& path);

// Lists `root`: when it holds subfolders, each is a class and its JPEG files (at any depth) are
// that class's samples; otherwise its own JPEG files are the samples. A folder that is missing,
// unreadable or holds no JPEG file is an error naming it.
Result<Dataset> list_dataset(const std::filesystem::path& root);

}  // namespace dlprobe::data
