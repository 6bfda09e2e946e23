#include "dlprobe/history/history.h"

#include <fmt/format.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "dlprobe/core/clock.h"
#include "dlprobe/core/files.h"
#include "dlprobe/results/table.h"
#include "statement.h"

namespace dlprobe::history {

namespace {

// "dlpH": marks the database as dlprobe's, so that another program's SQLite file is refused
// rather than written into.
constexpr int kApplicationId = 0x646c7048;

constexpr const char* kCreate = R"sql(
CREATE TABLE results (
  id INTEGER PRIMARY KEY,
  date TEXT NOT NULL,
  machine TEXT NOT NULL,
  gpu TEXT NOT NULL,
  driver TEXT NOT NULL,
  cuda TEXT NOT NULL,
  cudnn TEXT NOT NULL,
  cublas TEXT NOT NULL,
  framework TEXT NOT NULL,
  dlprobe_version TEXT NOT NULL,
  kind TEXT NOT NULL,
  configuration TEXT NOT NULL,
  model TEXT NOT NULL,
  precision TEXT NOT NULL,
  batch INTEGER,
  layout TEXT NOT NULL,
  status TEXT NOT NULL,
  throughput REAL,
  ci_low REAL,
  ci_high REAL,
  median_s REAL,
  p90_s REAL,
  p99_s REAL,
  cv REAL,
  peak_memory_bytes INTEGER,
  energy_j REAL,
  items REAL,
  command TEXT NOT NULL,
  gpus INTEGER NOT NULL DEFAULT 1,
  document TEXT NOT NULL,
  digest INTEGER NOT NULL UNIQUE
);
CREATE INDEX results_by_date ON results (date, id);
CREATE INDEX results_by_configuration ON results (configuration, machine, gpu, date);
)sql";

constexpr const char* kColumns =
    "id, date, machine, gpu, driver, cuda, cudnn, cublas, framework, dlprobe_version, kind, "
    "configuration, model, precision, batch, layout, status, throughput, ci_low, ci_high, "
    "median_s, p90_s, p99_s, cv, peak_memory_bytes, energy_j, items, command, gpus";

std::string library_version(const results::Context& c, std::string_view name) {
  for (const auto& l : c.libraries) {
    if (l.name == name) return l.version;
  }
  return "";
}

std::string framework_of(const results::Context& c) {
  for (const auto& l : c.libraries) {
    for (std::string_view f : {"PyTorch", "TensorFlow", "JAX"}) {
      if (l.name == f && !l.version.empty()) return fmt::format("{} {}", l.name, l.version);
    }
  }
  return "";
}

// FNV-1a (64 bits) of a row's document: the same configuration of the same results file, added
// twice (stored by the command, then imported from its file), has the same text and so the same
// digest, on any build and machine; std::hash promises neither.
std::int64_t digest(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return static_cast<std::int64_t>(h);
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

// Schema 1 to 2: the GPUs a result used (its rows read 1, what schema 1 assumed). Under the write
// lock, by whichever process comes first; the others see it done.
Status upgrade(Database& db) {
  DLPROBE_RETURN_IF_ERROR(db.execute("BEGIN IMMEDIATE"));
  Status done = [&]() -> Status {
    DLPROBE_ASSIGN_OR_RETURN(const std::int64_t now, db.pragma_integer("user_version"));
    if (now >= 2) return Status::ok();
    DLPROBE_RETURN_IF_ERROR(
        db.execute("ALTER TABLE results ADD COLUMN gpus INTEGER NOT NULL DEFAULT 1"));
    return db.execute(fmt::format("PRAGMA user_version = {}", kSchemaVersion));
  }();
  if (!done) {
    (void)db.execute("ROLLBACK");
    return done;
  }
  return db.execute("COMMIT");
}

Entry read_entry(Statement& s) {
  Entry e;
  int i = 0;
  e.id = s.integer(i++);
  for (std::string* field :
       {&e.date, &e.machine, &e.gpu, &e.driver, &e.cuda, &e.cudnn, &e.cublas, &e.framework,
        &e.dlprobe_version, &e.kind, &e.configuration, &e.model, &e.precision}) {
    *field = s.text(i++);
  }
  e.batch = s.optional_integer(i++);
  e.layout = s.text(i++);
  e.status = s.text(i++);
  for (std::optional<double>* field :
       {&e.throughput, &e.ci_low, &e.ci_high, &e.median_s, &e.p90_s, &e.p99_s, &e.cv}) {
    *field = s.optional_real(i++);
  }
  e.peak_memory_bytes = s.optional_integer(i++);
  e.energy_j = s.optional_real(i++);
  e.items = s.optional_real(i++);
  e.command = s.text(i++);
  e.gpus = s.integer(i++);
  return e;
}

using Instant = std::chrono::sys_time<std::chrono::milliseconds>;

// A bound of --since or --until as the instant it names: a time as given (12:00, 12:00:00 and
// 12:00:00Z are one instant), a date from the start of its day (since) or to its end (until).
// Dates are compared as instants, not as text: as text "12:00:30" sorts before "12:00Z" and after
// "12:00:00Z".
Result<std::optional<Instant>> time_bound(const std::string& text, const char* which,
                                          bool end_of_day) {
  if (text.empty()) return std::optional<Instant>{};
  const std::optional<Instant> t = parse_utc_time(text);
  if (!t) {
    return invalid_argument(
        fmt::format("{} '{}': not a date (2026-03-01 or 2026-03-01T12:00:00Z)", which, text));
  }
  if (end_of_day && text.size() == 10)
    return std::optional<Instant>{*t + std::chrono::days(1) - std::chrono::milliseconds(1)};
  return std::optional<Instant>{*t};
}

}  // namespace

Result<std::filesystem::path> default_path() {
  return xdg_file("XDG_DATA_HOME", ".local/share", "history.sqlite", "history", "--history FILE");
}

Entry entry_of(const results::Document& document, std::size_t index) {
  const results::Context& c = document.context;
  const results::Configuration& conf = document.configurations.at(index);
  Entry e;
  e.date = c.date;
  e.machine = c.hostname;
  // The GPUs it used are those its telemetry sampled (one entry per GPU used).
  std::vector<int> used;
  for (const results::Telemetry& t : conf.telemetry) {
    if (std::find(used.begin(), used.end(), t.gpu) == used.end()) used.push_back(t.gpu);
  }
  e.gpus = std::max<std::int64_t>(static_cast<std::int64_t>(used.size()), 1);
  const auto named =
      used.empty() ? c.gpus.end() : std::find_if(c.gpus.begin(), c.gpus.end(), [&](const auto& g) {
        return g.index == used.front();
      });
  e.gpu = named != c.gpus.end() ? named->name : c.gpus.empty() ? "" : c.gpus.front().name;
  e.driver = c.driver_version.value_or("");
  e.cuda = c.cuda_runtime_version.value_or(c.cuda_driver_version.value_or(""));
  e.cudnn = library_version(c, "cuDNN");
  e.cublas = library_version(c, "cuBLAS");
  e.framework = framework_of(c);
  e.dlprobe_version = c.dlprobe_version;
  e.kind = std::string(results::kind_name(conf.kind));
  e.configuration = results::describe(conf.kind, conf.settings);
  e.model = conf.kind == results::Kind::native ? conf.settings.model : "";
  e.precision = results::precision_of(conf.kind, conf.settings);
  e.batch = results::batch_of(conf.kind, conf.settings);
  e.layout = conf.settings.layout;
  e.status = std::string(results::run_status_name(conf.status));
  if (conf.statistics) {
    const stats::Summary& s = *conf.statistics;
    e.throughput = s.throughput;
    e.ci_low = s.throughput_ci.low;
    e.ci_high = s.throughput_ci.high;
    e.median_s = s.median_s;
    e.p90_s = s.p90_s;
    e.p99_s = s.p99_s;
    e.cv = s.cv;
    e.items = s.total_items;
  }
  if (conf.memory) e.peak_memory_bytes = results::peak_memory_bytes(*conf.memory);
  e.energy_j = results::energy_j(conf);
  e.command = joined(c.command_line);
  return e;
}

Result<History> History::open(const std::filesystem::path& path, const OpenOptions& options) {
  if (options.create && path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) {
      return error(Errc::io_error, fmt::format("history {}: cannot create its folder: {}",
                                               path.string(), ec.message()));
    }
  }
  std::error_code looked;
  const bool there = std::filesystem::exists(path, looked);
  if (looked) {
    return error(Errc::io_error,
                 fmt::format("history {}: cannot look at it: {}", path.string(), looked.message()));
  }
  if (!options.create && !there) {
    return error(Errc::not_found,
                 fmt::format("no history at {} yet: evaluate, bench, memory and run add their "
                             "results to it, dlprobe history import adds results files",
                             path.string()));
  }
  sqlite3* raw = nullptr;
  const int flags =
      SQLITE_OPEN_READWRITE | (options.create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_FULLMUTEX;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  History h(path, raw);  // closes the handle on every path out, as sqlite3_open_v2 asks
  if (rc != SQLITE_OK) return sqlite_error(raw, rc, path, "cannot open");
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, static_cast<int>(options.busy_timeout.count()));
  Database db{raw, path};

  // The first read of the file: a file that is not a database fails here.
  DLPROBE_ASSIGN_OR_RETURN(const std::int64_t version, db.pragma_integer("user_version"));
  if (version > kSchemaVersion) {
    return invalid_argument(fmt::format(
        "history {}: written by a newer dlprobe (schema {}, this one knows {}); upgrade dlprobe",
        path.string(), version, kSchemaVersion));
  }
  // Switching a new file to WAL takes an exclusive lock for which SQLite does not call the busy
  // handler, so two processes opening a new history at once would see "locked" at once: the
  // switch is retried here within the same busy timeout.
  const auto deadline = std::chrono::steady_clock::now() + options.busy_timeout;
  for (;;) {
    const int wal = sqlite3_exec(raw, "PRAGMA journal_mode = WAL", nullptr, nullptr, nullptr);
    if (wal == SQLITE_OK) break;
    if ((wal & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) {
      return sqlite_error(raw, wal, path, "cannot write");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // In WAL mode NORMAL loses no committed row on a process crash, only possibly the last ones on
  // a power cut, and spares an fsync per row.
  DLPROBE_RETURN_IF_ERROR(db.execute("PRAGMA synchronous = NORMAL"));
  if (version == 0) {
    // Two processes may find the same new file at once: the schema is made under the write lock,
    // by whichever comes first, and the other sees it made.
    DLPROBE_RETURN_IF_ERROR(db.execute("BEGIN IMMEDIATE"));
    Status made = [&]() -> Status {
      DLPROBE_ASSIGN_OR_RETURN(const std::int64_t now, db.pragma_integer("user_version"));
      if (now != 0) return Status::ok();
      DLPROBE_ASSIGN_OR_RETURN(const std::int64_t tables,
                               db.single_integer("SELECT count(*) FROM sqlite_schema"));
      if (tables > 0) {
        return invalid_argument(fmt::format(
            "history {}: an SQLite database of another program, not a dlprobe history; give "
            "--history another file",
            path.string()));
      }
      DLPROBE_RETURN_IF_ERROR(db.execute(kCreate));
      DLPROBE_RETURN_IF_ERROR(
          db.execute(fmt::format("PRAGMA application_id = {}", kApplicationId)));
      return db.execute(fmt::format("PRAGMA user_version = {}", kSchemaVersion));
    }();
    if (!made) {
      (void)db.execute("ROLLBACK");
      return made;
    }
    DLPROBE_RETURN_IF_ERROR(db.execute("COMMIT"));
  } else {
    DLPROBE_ASSIGN_OR_RETURN(const std::int64_t id, db.pragma_integer("application_id"));
    if (id != kApplicationId) {
      return invalid_argument(fmt::format(
          "history {}: an SQLite database of another program, not a dlprobe history; give "
          "--history another file",
          path.string()));
    }
    if (version < kSchemaVersion) DLPROBE_RETURN_IF_ERROR(upgrade(db));
  }
  return h;
}

History::History(History&& other) noexcept
    : path_(std::move(other.path_)), db_(std::exchange(other.db_, nullptr)) {}

History& History::operator=(History&& other) noexcept {
  if (this != &other) {
    if (db_ != nullptr) sqlite3_close_v2(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
  }
  return *this;
}

History::~History() {
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

Result<Added> History::add(const results::Document& document) {
  Database db{db_, path_};
  Added out;
  std::string marks;
  for (int i = 0; i < 28; ++i) marks += ", ?";
  const std::string insert =
      fmt::format("INSERT OR IGNORE INTO results ({}, document, digest) VALUES (NULL{}, ?, ?)",
                  kColumns, marks);
  for (std::size_t i = 0; i < document.configurations.size(); ++i) {
    const Entry e = entry_of(document, i);
    results::Document one;
    one.context = document.context;
    one.configurations.push_back(document.configurations[i]);
    one.findings = document.findings;
    const std::string text = results::to_json(one).dump();
    DLPROBE_ASSIGN_OR_RETURN(Statement s, db.prepare(insert));
    int k = 1;
    for (const std::string* field :
         {&e.date, &e.machine, &e.gpu, &e.driver, &e.cuda, &e.cudnn, &e.cublas, &e.framework,
          &e.dlprobe_version, &e.kind, &e.configuration, &e.model, &e.precision}) {
      s.bind(k++, *field);
    }
    s.bind(k++, e.batch);
    s.bind(k++, e.layout);
    s.bind(k++, e.status);
    for (const std::optional<double>* field :
         {&e.throughput, &e.ci_low, &e.ci_high, &e.median_s, &e.p90_s, &e.p99_s, &e.cv}) {
      s.bind(k++, *field);
    }
    s.bind(k++, e.peak_memory_bytes);
    s.bind(k++, e.energy_j);
    s.bind(k++, e.items);
    s.bind(k++, e.command);
    s.bind(k++, e.gpus);
    s.bind(k++, text);
    s.bind(k++, digest(text));
    // A single INSERT outside BEGIN is a transaction of its own: the row is all there or not.
    DLPROBE_RETURN_IF_ERROR(s.run());
    if (sqlite3_changes(db_) > 0) {
      ++out.added;
    } else {
      ++out.already;
    }
  }
  return out;
}

Result<std::vector<Entry>> History::list(const Filter& filter) const {
  DLPROBE_ASSIGN_OR_RETURN(const std::optional<Instant> since,
                           time_bound(filter.since, "--since", false));
  DLPROBE_ASSIGN_OR_RETURN(const std::optional<Instant> until,
                           time_bound(filter.until, "--until", true));
  if (since && until && *since > *until) {
    return invalid_argument(fmt::format("--since {} is after --until {}: no result lies between",
                                        filter.since, filter.until));
  }
  Database db{db_, path_};
  std::string sql = fmt::format("SELECT {} FROM results WHERE 1", kColumns);
  std::vector<std::string> texts;
  const auto like = [&](const std::string& value, const char* column) {
    if (value.empty()) return;
    sql += fmt::format(" AND {} LIKE ? ESCAPE '\\'", column);
    std::string pattern = "%";
    for (char c : value) {
      if (c == '%' || c == '_' || c == '\\') pattern += '\\';
      pattern += c;
    }
    texts.push_back(pattern + "%");
  };
  const auto equal = [&](const std::string& value, const char* column) {
    if (value.empty()) return;
    sql += fmt::format(" AND {} = ?", column);
    texts.push_back(value);
  };
  like(filter.machine, "machine");
  like(filter.gpu, "gpu");
  like(filter.driver, "driver");
  equal(filter.model, "model");
  equal(filter.precision, "precision");
  if (filter.batch) sql += " AND batch = ?";
  sql += " ORDER BY date, id";
  DLPROBE_ASSIGN_OR_RETURN(Statement s, db.prepare(sql));
  int k = 1;
  for (const auto& t : texts) s.bind(k++, t);
  if (filter.batch) s.bind(k++, filter.batch);
  // A date dlprobe did not write (an imported "2026-03-01 12:00:00", an offset) is compared as
  // text rather than dropped by every bound.
  const std::string until_text =
      filter.until.size() == 10 ? filter.until + "T23:59:59Z" : filter.until;
  const auto within = [&](const std::string& date) {
    if (const std::optional<Instant> at = parse_utc_time(date)) {
      return (!since || *at >= *since) && (!until || *at <= *until);
    }
    return (!since || date >= filter.since) && (!until || date <= until_text);
  };
  std::vector<Entry> out;
  for (;;) {
    DLPROBE_ASSIGN_OR_RETURN(const bool row, s.step());
    if (!row) break;
    Entry e = read_entry(s);
    if (within(e.date)) out.push_back(std::move(e));
  }
  return out;
}

Result<results::Document> History::document(std::int64_t id) const {
  Database db{db_, path_};
  DLPROBE_ASSIGN_OR_RETURN(Statement s, db.prepare("SELECT document FROM results WHERE id = ?"));
  s.bind(1, std::optional<std::int64_t>(id));
  DLPROBE_ASSIGN_OR_RETURN(const bool row, s.step());
  if (!row) {
    return error(Errc::not_found,
                 fmt::format("history {}: no result #{} (dlprobe history list shows the numbers)",
                             path_.string(), id));
  }
  return results::parse(s.text(0), fmt::format("history {} #{}", path_.string(), id));
}

Result<Added> import_file(History& history, const std::filesystem::path& path) {
  DLPROBE_ASSIGN_OR_RETURN(const results::Document document, results::read_file(path));
  auto added = history.add(document);
  if (!added) return added.status().with_context(path.string());
  return added;
}

Status store(const results::Document& document, const std::filesystem::path& path) {
  if (document.configurations.empty()) return Status::ok();
  std::filesystem::path where = path;
  if (where.empty()) {
    DLPROBE_ASSIGN_OR_RETURN(where, default_path());
  }
  DLPROBE_ASSIGN_OR_RETURN(History history, History::open(where));
  auto added = history.add(document);
  return added ? Status::ok() : added.status();
}

}  // namespace dlprobe::history
