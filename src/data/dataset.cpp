#include "dlprobe/data/dataset.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <system_error>
#include <utility>

namespace dlprobe::data {

namespace fs = std::filesystem;

bool is_jpeg_name(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg";
}

namespace {

Status listing_error(const fs::path& path, const std::error_code& ec) {
  return error(Errc::io_error, fmt::format("{}: cannot list: {}", path.string(), ec.message()));
}

// The JPEG files under `folder`, at any depth, sorted by path.
Result<std::vector<fs::path>> jpeg_files_under(const fs::path& folder, bool recursive) {
  std::vector<fs::path> files;
  std::error_code ec;
  const auto add = [&](const fs::directory_entry& entry) {
    std::error_code type_ec;
    if (entry.is_regular_file(type_ec) && is_jpeg_name(entry.path())) files.push_back(entry.path());
  };
  if (recursive) {
    // Links to folders are followed (a dataset assembled from links), each folder once: a link to
    // a folder above it would otherwise be walked without end.
    std::set<std::pair<dev_t, ino_t>> walked;
    const auto first_visit = [&](const fs::path& dir) {
      struct stat st {};
      return ::stat(dir.c_str(), &st) != 0 || walked.insert({st.st_dev, st.st_ino}).second;
    };
    first_visit(folder);
    fs::recursive_directory_iterator it(folder, fs::directory_options::follow_directory_symlink,
                                        ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code type_ec;
      if (it->is_directory(type_ec) && !first_visit(it->path())) {
        it.disable_recursion_pending();
        continue;
      }
      add(*it);
    }
  } else {
    fs::directory_iterator it(folder, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) add(*it);
  }
  if (ec) return listing_error(folder, ec);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

Result<Dataset> list_dataset(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return error(fs::exists(root, ec) ? Errc::invalid_argument : Errc::not_found,
                 fmt::format("{}: not a folder", root.string()));
  }
  std::vector<fs::path> class_folders;
  fs::directory_iterator it(root, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) class_folders.push_back(it->path());
  }
  if (ec) return listing_error(root, ec);
  std::sort(class_folders.begin(), class_folders.end());

  Dataset dataset;
  dataset.root = root;
  if (class_folders.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(auto files, jpeg_files_under(root, false));
    for (auto& file : files) dataset.samples.push_back({std::move(file), 0});
  } else {
    // As ImageFolder: every subfolder is a class, an empty one too (the labels stay the folder
    // indices whatever the folders hold).
    for (const fs::path& folder : class_folders) {
      DLPROBE_ASSIGN_OR_RETURN(auto files, jpeg_files_under(folder, true));
      const int label = static_cast<int>(dataset.classes.size());
      dataset.classes.push_back(folder.filename().string());
      for (auto& file : files) dataset.samples.push_back({std::move(file), label});
    }
  }
  if (dataset.samples.empty()) {
    return invalid_argument(fmt::format("{}: no .jpg or .jpeg file in it{}", root.string(),
                                        class_folders.empty() ? "" : " or its class folders"));
  }
  return dataset;
}

}  // namespace dlprobe::data
