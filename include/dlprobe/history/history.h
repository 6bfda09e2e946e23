// The history: every measured configuration of every results file in one SQLite database, so that
// runs of many days and machines can be listed, filtered, followed as a trend and told apart.
//
// One row per configuration, with the columns one filters and sorts on (machine, GPU model,
// driver, library versions, model, precision, batch, throughput and its CI, step-time statistics,
// peak memory, energy, date, command) and the configuration's own results document
// (dlprobe.results/1: the run's context, this configuration and the run's findings) as text, so
// that nothing a results file holds is lost and a row can be read back as a results file.
//
// The database is versioned (PRAGMA user_version; a database of a newer dlprobe is refused rather
// than misread), journals in WAL mode, and waits for a busy database (a busy timeout) instead of
// failing, so that two processes writing at once both keep every row. Each row is written in a
// transaction of its own: a crash while writing loses at most the row being written. A
// configuration added twice (its results document the same to the byte) is kept once.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dlprobe/core/status.h"
#include "dlprobe/results/results.h"

struct sqlite3;

namespace dlprobe::history {

// The schema this dlprobe writes and reads; a database with a higher PRAGMA user_version came from
// a newer dlprobe and is refused.
inline constexpr int kSchemaVersion = 2;

// $XDG_DATA_HOME/dlprobe/history.sqlite when XDG_DATA_HOME is an absolute path, else
// $HOME/.local/share/dlprobe/history.sqlite (the XDG Base Directory default). Fails when neither
// variable says where.
Result<std::filesystem::path> default_path();

// One stored configuration: the columns of a row, without its results document.
struct Entry {
  std::int64_t id = 0;
  std::string date;  // the run's ISO-8601 UTC start, from the results file
  std::string machine;
  // The name of the (first) GPU the run used, from its telemetry; the machine's first GPU where it
  // has none; "" on a CPU-only machine.
  std::string gpu;
  // How many GPUs the run used (its telemetry's; 1 where it has none): a result's cost is that many
  // GPU-hours an hour. Rows added before schema 2 read 1.
  std::int64_t gpus = 1;
  std::string driver;
  std::string cuda;  // the CUDA runtime dlprobe ran on, else the newest the driver supports
  std::string cudnn;
  std::string cublas;
  std::string framework;  // "PyTorch 2.5.1" when the results name one; else ""
  std::string dlprobe_version;
  std::string kind;           // "native" or "external"
  std::string configuration;  // results::describe()
  std::string model;
  std::string precision;
  std::optional<std::int64_t> batch;
  std::string layout;
  std::string status;  // results::run_status_name()
  std::optional<double> throughput;
  std::optional<double> ci_low;
  std::optional<double> ci_high;
  std::optional<double> median_s;
  std::optional<double> p90_s;
  std::optional<double> p99_s;
  std::optional<double> cv;
  std::optional<std::int64_t> peak_memory_bytes;
  std::optional<double> energy_j;  // over the timed window, summed over the GPUs sampled
  std::optional<double> items;     // images the timed steps processed
  std::string command;             // the dlprobe command line that measured it

  friend bool operator==(const Entry&, const Entry&) = default;
};

// Which rows to list. Text filters match a part of the value, ignoring ASCII case ("h200"
// matches "NVIDIA H200"); model and precision match whole values. since/until are dates
// ("2026-03-01") or ISO-8601 times; until includes the whole of a date's day.
struct Filter {
  std::string machine;
  std::string gpu;
  std::string driver;
  std::string model;
  std::string precision;
  std::optional<std::int64_t> batch;
  std::string since;
  std::string until;
};

struct OpenOptions {
  // How long a write waits for another writer before it fails as "locked".
  std::chrono::milliseconds busy_timeout{10'000};
  // Create the file (and its folder) when missing; without it a missing file is an error.
  bool create = true;
};

// What add() did with a results document.
struct Added {
  int added = 0;
  int already = 0;  // rows the history held already
};

class History {
 public:
  // Opens or creates the database and brings an empty one to the current schema. Errors name the
  // file and say what to do: not a database (corrupt, or another program's), a newer schema, a
  // database locked beyond the busy timeout.
  static Result<History> open(const std::filesystem::path& path, const OpenOptions& options = {});

  History(History&&) noexcept;
  History& operator=(History&&) noexcept;
  ~History();

  // One row per configuration of `document`, each in a transaction of its own.
  Result<Added> add(const results::Document& document);

  // The rows that pass `filter`, oldest first (by date, then by id).
  Result<std::vector<Entry>> list(const Filter& filter = {}) const;
  // A row's results document: the run's context, the one configuration and the run's findings.
  Result<results::Document> document(std::int64_t id) const;

  const std::filesystem::path& path() const { return path_; }

 private:
  History(std::filesystem::path path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
};

// The row add() would write for configuration `index` of `document` (id 0).
Entry entry_of(const results::Document& document, std::size_t index);

// Reads a results file (strictly, as compare does) and adds it; an error names the file: not
// results, another schema, cut off.
Result<Added> import_file(History& history, const std::filesystem::path& path);

// What a measuring command does with its results when it is done: opens the history at `path`
// (empty: default_path()) and adds the document. The caller warns on an error and goes on: the
// results file is written already, and the measurement stands without its history row.
Status store(const results::Document& document, const std::filesystem::path& path);

}  // namespace dlprobe::history
