#include "dlprobe/history/history.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "common/temp_folder.h"
#include "history/sample.h"

namespace dlprobe::history {
namespace {

using testing::document;
using testing::RunSpec;

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Runs `sql` on `path` through a connection of the test's own.
void raw_sql(const std::filesystem::path& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
}

TEST(History, StoresOneRowPerConfigurationWithItsColumns) {
  dlprobe::testing::TempFolder dir;
  auto h = History::open(dir / "sub" / "history.sqlite");
  ASSERT_TRUE(h) << h.status().message();
  results::Document d = document(RunSpec().using_energy(128.0));
  d.configurations.push_back(testing::configuration(RunSpec().in("fp32").batch_of(32)));
  auto added = h->add(d);
  ASSERT_TRUE(added) << added.status().message();
  EXPECT_EQ(added->added, 2);
  auto rows = h->list();
  ASSERT_TRUE(rows) << rows.status().message();
  ASSERT_EQ(rows->size(), 2u);
  const Entry& e = rows->front();
  EXPECT_EQ(e.machine, "node1");
  EXPECT_EQ(e.gpu, "NVIDIA H200");
  EXPECT_EQ(e.driver, "580.65.06");
  EXPECT_EQ(e.cuda, "13.0");
  EXPECT_EQ(e.cudnn, "9.19.0");
  EXPECT_EQ(e.cublas, "13.0.0");
  EXPECT_EQ(e.model, "resnet50");
  EXPECT_EQ(e.precision, "bf16");
  EXPECT_EQ(e.batch, 64);
  EXPECT_EQ(e.layout, "nhwc");
  EXPECT_EQ(e.status, "ok");
  EXPECT_EQ(e.command, "dlprobe bench");
  EXPECT_EQ(e.energy_j, 128.0);
  EXPECT_EQ(e.items, 64.0 * 40);
  ASSERT_TRUE(e.throughput);
  EXPECT_NEAR(*e.throughput, 640, 10);
  Entry expected = entry_of(d, 0);
  expected.id = e.id;
  EXPECT_EQ(e, expected);
  EXPECT_EQ(rows->back().batch, 32);
}

TEST(History, ARowReadsBackAsItsResultsDocument) {
  dlprobe::testing::TempFolder dir;
  auto h = History::open(dir / "h.sqlite");
  ASSERT_TRUE(h);
  const results::Document d = document(RunSpec());
  ASSERT_TRUE(h->add(d));
  auto rows = h->list();
  ASSERT_TRUE(rows);
  auto back = h->document(rows->front().id);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(*back, d);
  auto missing = h->document(999);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("no result #999"), std::string::npos);
}

TEST(History, TheSameResultsAddedTwiceAreKeptOnce) {
  dlprobe::testing::TempFolder dir;
  auto h = History::open(dir / "h.sqlite");
  ASSERT_TRUE(h);
  ASSERT_TRUE(h->add(document(RunSpec())));
  auto again = h->add(document(RunSpec()));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->added, 0);
  EXPECT_EQ(again->already, 1);
  EXPECT_EQ(h->list()->size(), 1u);
}

TEST(History, FiltersSelectRows) {
  dlprobe::testing::TempFolder dir;
  auto h = History::open(dir / "h.sqlite");
  ASSERT_TRUE(h);
  ASSERT_TRUE(h->add(document(RunSpec().on("alpha").at("2026-03-01T10:00:00Z"))));
  ASSERT_TRUE(
      h->add(document(RunSpec().on("beta").at("2026-03-02T10:00:00Z").driven_by("570.86.15"))));
  ASSERT_TRUE(
      h->add(document(RunSpec().on("beta").at("2026-03-03T10:00:00Z").in("fp32").batch_of(128))));
  // Rows that pass the filter `set` makes.
  const auto count = [&](const std::function<void(Filter&)>& set) {
    Filter f;
    set(f);
    auto rows = h->list(f);
    EXPECT_TRUE(rows) << rows.status().message();
    return rows ? rows->size() : 0u;
  };
  EXPECT_EQ(count([](Filter&) {}), 3u);
  EXPECT_EQ(count([](Filter& f) { f.machine = "BET"; }), 2u);
  EXPECT_EQ(count([](Filter& f) { f.gpu = "h200"; }), 3u);
  EXPECT_EQ(count([](Filter& f) { f.gpu = "a100"; }), 0u);
  EXPECT_EQ(count([](Filter& f) { f.driver = "570"; }), 1u);
  EXPECT_EQ(count([](Filter& f) { f.model = "resnet50"; }), 3u);
  EXPECT_EQ(count([](Filter& f) { f.model = "resnet"; }), 0u);
  EXPECT_EQ(count([](Filter& f) { f.precision = "fp32"; }), 1u);
  EXPECT_EQ(count([](Filter& f) { f.batch = 64; }), 2u);
  EXPECT_EQ(count([](Filter& f) { f.since = "2026-03-02"; }), 2u);
  EXPECT_EQ(count([](Filter& f) { f.until = "2026-03-02"; }), 2u);
  EXPECT_EQ(count([](Filter& f) {
              f.since = "2026-03-02";
              f.until = "2026-03-02";
            }),
            1u);
  // A LIKE wildcard in a filter is a plain character.
  EXPECT_EQ(count([](Filter& f) { f.machine = "%"; }), 0u);
  Filter bad_date;
  bad_date.since = "yesterday";
  auto bad = h->list(bad_date);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("--since 'yesterday'"), std::string::npos);
  Filter reversed;
  reversed.since = "2026-03-03";
  reversed.until = "2026-03-02";
  auto none = h->list(reversed);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().message(),
            "--since 2026-03-03 is after --until 2026-03-02: no result lies between");
  // Shaped like a date but none: each is refused, where as text it would select all or nothing.
  for (const char* date : {"2026-13-01", "2026-00-10", "2026-02-30", "2026-12-07T24:00:00Z",
                           "2026-12-07T12:60", "2026-12-07T12:00:61Z", "2026-12-07T", "2026-12-07Z",
                           "2026-12-07 12:00", "2026-12-07T12:00:00+01:00", "2026/12/07"}) {
    Filter f;
    f.until = date;
    auto r = h->list(f);
    ASSERT_FALSE(r) << date;
    EXPECT_NE(r.status().message().find(std::string("--until '") + date + "': not a date"),
              std::string::npos)
        << r.status().message();
  }
  for (const char* date : {"2024-02-29", "2026-12-07T12", "2026-12-07T12:30",
                           "2026-12-07T23:59:60Z", "2026-12-07T00:00:00Z"}) {
    Filter f;
    f.since = date;
    EXPECT_TRUE(h->list(f)) << date;
  }
}

// Bounds are instants, however written: 12, 12:00 and 12:00:00Z name one, and a row at 12:00:30
// lies after it (as text, "12:00:30" sorts before "12:00Z" and "12Z", and after "12:00:00Z").
TEST(History, TimeBoundsAreInstants) {
  dlprobe::testing::TempFolder dir;
  auto h = History::open(dir / "h.sqlite");
  ASSERT_TRUE(h);
  for (const char* at : {"2026-11-07T11:59:59Z", "2026-11-07T12:00:00Z", "2026-11-07T12:00:30Z",
                         "2026-11-07T12:45:00Z", "2026-11-07T23:59:59Z", "2026-11-08T00:00:00Z"}) {
    ASSERT_TRUE(h->add(document(RunSpec().at(at))));
  }
  // The times of the rows that pass.
  const auto times = [&](const std::string& since, const std::string& until) {
    Filter f;
    f.since = since;
    f.until = until;
    auto rows = h->list(f);
    EXPECT_TRUE(rows) << since << " " << until << ": " << rows.status().message();
    std::string out;
    for (const Entry& e : rows.value_or(std::vector<Entry>{})) {
      out += (out.empty() ? "" : " ") + e.date.substr(11, 8);
    }
    return out;
  };
  for (const char* noon : {"2026-11-07T12", "2026-11-07T12Z", "2026-11-07T12:00",
                           "2026-11-07T12:00Z", "2026-11-07T12:00:00", "2026-11-07T12:00:00Z"}) {
    EXPECT_EQ(times("", noon), "11:59:59 12:00:00") << noon;
    EXPECT_EQ(times(noon, ""), "12:00:00 12:00:30 12:45:00 23:59:59 00:00:00") << noon;
    EXPECT_EQ(times(noon, noon), "12:00:00") << noon;
  }
  EXPECT_EQ(times("2026-11-07T12:00:01", "2026-11-07"), "12:00:30 12:45:00 23:59:59");
  EXPECT_EQ(times("2026-11-08", ""), "00:00:00");
}

// A date dlprobe would not write (imported from elsewhere) still passes a bound that holds it.
TEST(History, ADateNotOfDlprobesFormStaysWithinItsBounds) {
  dlprobe::testing::TempFolder dir;
  auto h = History::open(dir / "h.sqlite");
  ASSERT_TRUE(h);
  ASSERT_TRUE(h->add(document(RunSpec().at("2026-11-07 12:00:00"))));
  const auto count = [&](const std::string& since, const std::string& until) {
    Filter f;
    f.since = since;
    f.until = until;
    auto rows = h->list(f);
    EXPECT_TRUE(rows) << rows.status().message();
    return rows ? rows->size() : 0u;
  };
  EXPECT_EQ(count("2026-11-01", ""), 1u);
  EXPECT_EQ(count("", "2026-12-31"), 1u);
  EXPECT_EQ(count("2026-11-08", ""), 0u);
  EXPECT_EQ(count("", "2026-11-06"), 0u);
}

TEST(History, DefaultPathFollowsXdgDataHome) {
  const char* old_xdg = std::getenv("XDG_DATA_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  ::setenv("XDG_DATA_HOME", "/data/x", 1);
  EXPECT_EQ(default_path().value(), "/data/x/dlprobe/history.sqlite");
  // A relative XDG_DATA_HOME is invalid by the specification and ignored.
  ::setenv("XDG_DATA_HOME", "relative", 1);
  const char* home = std::getenv("HOME");
  if (home != nullptr) {
    EXPECT_EQ(default_path().value(),
              std::filesystem::path(home) / ".local/share/dlprobe/history.sqlite");
  }
  if (old_xdg) {
    ::setenv("XDG_DATA_HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("XDG_DATA_HOME");
  }
}

TEST(History, ARandomFileIsRefusedAndLeftAsItWas) {
  dlprobe::testing::TempFolder dir;
  const auto path = dir / "h.sqlite";
  std::string bytes(8192, '\0');
  std::mt19937 rng(7);
  for (char& c : bytes) c = static_cast<char>(rng());
  std::ofstream(path, std::ios::binary) << bytes;
  auto h = History::open(path);
  ASSERT_FALSE(h);
  const std::string& m = h.status().message();
  EXPECT_NE(m.find(path.string()), std::string::npos) << m;
  EXPECT_NE(m.find("damaged or not a database"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos);
  EXPECT_EQ(slurp(path), bytes);
}

TEST(History, AHistoryOfANewerSchemaIsRefused) {
  dlprobe::testing::TempFolder dir;
  const auto path = dir / "h.sqlite";
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    ASSERT_TRUE(h->add(document(RunSpec())));
  }
  raw_sql(path, "PRAGMA user_version = " + std::to_string(kSchemaVersion + 1));
  auto h = History::open(path);
  ASSERT_FALSE(h);
  EXPECT_NE(h.status().message().find("newer dlprobe"), std::string::npos);
  EXPECT_NE(h.status().message().find("upgrade dlprobe"), std::string::npos);
  // Nothing was lost: the row is there for the dlprobe that wrote the schema.
  raw_sql(path, "PRAGMA user_version = " + std::to_string(kSchemaVersion));
  EXPECT_EQ(History::open(path)->list()->size(), 1u);
}

// A run on GPUs 1 and 2 of a machine whose GPU 0 is another model: the row names the GPU it used
// and counts two.
TEST(History, ARowNamesTheGpusItsRunUsed) {
  results::Document d = document(RunSpec());
  d.context.gpus.clear();
  for (int i = 0; i < 3; ++i) {
    results::Gpu g;
    g.index = i;
    g.name = i == 0 ? "NVIDIA A100" : "NVIDIA H200";
    d.context.gpus.push_back(g);
  }
  for (int gpu : {1, 2}) {
    results::Telemetry t;
    t.gpu = gpu;
    d.configurations[0].telemetry.push_back(t);
  }
  const Entry e = entry_of(d, 0);
  EXPECT_EQ(e.gpu, "NVIDIA H200");
  EXPECT_EQ(e.gpus, 2);
  // Without telemetry: the machine's first GPU, one of it.
  d.configurations[0].telemetry.clear();
  EXPECT_EQ(entry_of(d, 0).gpu, "NVIDIA A100");
  EXPECT_EQ(entry_of(d, 0).gpus, 1);
}

// A history of schema 1 (no gpus column) opens, its rows read one GPU, and new rows keep theirs.
TEST(History, ASchemaOneHistoryIsUpgraded) {
  dlprobe::testing::TempFolder dir;
  const auto path = dir / "h.sqlite";
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    ASSERT_TRUE(h->add(document(RunSpec())));
  }
  // Schema 1 as it was: the same table without the column.
  raw_sql(path,
          "CREATE TABLE old AS SELECT * FROM results; DROP TABLE results; ALTER TABLE old RENAME "
          "TO results; ALTER TABLE results DROP COLUMN gpus; PRAGMA user_version = 1;");
  results::Document two = document(RunSpec().at("2026-03-03T12:00:00Z"));
  for (int gpu : {0, 1}) {
    results::Telemetry t;
    t.gpu = gpu;
    two.configurations[0].telemetry.push_back(t);
  }
  {
    auto h = History::open(path);
    ASSERT_TRUE(h) << h.status().message();
    ASSERT_TRUE(h->add(two));
    const auto rows = h->list();
    ASSERT_TRUE(rows);
    ASSERT_EQ(rows->size(), 2u);
    EXPECT_EQ((*rows)[0].gpus, 1);
    EXPECT_EQ((*rows)[1].gpus, 2);
  }
  EXPECT_EQ(History::open(path)->list()->size(), 2u);
}

TEST(History, AnotherProgramsDatabaseIsRefused) {
  dlprobe::testing::TempFolder dir;
  const auto path = dir / "other.sqlite";
  raw_sql(path, "CREATE TABLE t (x); INSERT INTO t VALUES (1);");
  auto h = History::open(path);
  ASSERT_FALSE(h);
  EXPECT_NE(h.status().message().find("another program"), std::string::npos);
}

TEST(History, ALockedHistoryFailsAfterTheBusyTimeoutAndKeepsItsRows) {
  dlprobe::testing::TempFolder dir;
  const auto path = dir / "h.sqlite";
  OpenOptions impatient;
  impatient.busy_timeout = std::chrono::milliseconds(50);
  auto h = History::open(path, impatient);
  ASSERT_TRUE(h);
  ASSERT_TRUE(h->add(document(RunSpec())));
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto blocked = h->add(document(RunSpec().at("2026-03-02T12:00:00Z")));
  ASSERT_FALSE(blocked);
  EXPECT_NE(blocked.status().message().find("locked by another process"), std::string::npos)
      << blocked.status().message();
  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  ASSERT_TRUE(h->add(document(RunSpec().at("2026-03-02T12:00:00Z"))));
  EXPECT_EQ(h->list()->size(), 2u);
}

TEST(History, TwoWritersAtOnceKeepEveryRow) {
  dlprobe::testing::TempFolder dir;
  const auto path = dir / "h.sqlite";
  constexpr int kEach = 100;
  const auto writer = [&](std::string machine, Status* failure) {
    auto h = History::open(path);
    if (!h) {
      *failure = h.status();
      return;
    }
    for (int i = 0; i < kEach; ++i) {
      char date[32];
      std::snprintf(date, sizeof date, "2026-03-01T12:%02d:%02dZ", i / 60, i % 60);
      auto added = h->add(document(RunSpec().on(machine).at(date).timing(4)));
      if (!added) {
        *failure = added.status();
        return;
      }
    }
  };
  Status a, b;
  std::thread first(writer, "alpha", &a);
  std::thread second(writer, "beta", &b);
  first.join();
  second.join();
  EXPECT_TRUE(a) << a.message();
  EXPECT_TRUE(b) << b.message();
  EXPECT_EQ(History::open(path)->list()->size(), 2u * kEach);
}

}  // namespace
}  // namespace dlprobe::history
