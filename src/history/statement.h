// A thin layer over SQLite's C API for the history: statements closed by their destructor, and
// every failure turned into one Status line naming the database and saying what to do. Debian's
// C++ wrapper (SQLiteCpp) reports errors as exceptions; dlprobe's library code returns Status, so
// the few calls the history makes are wrapped here instead.
#pragma once

#include <fmt/format.h>
#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dlprobe/core/status.h"

namespace dlprobe::history {

// The one line of a failed SQLite call on `path`; the primary result code picks what the user is
// told to do.
inline Status sqlite_error(sqlite3* db, int rc, const std::filesystem::path& path,
                           std::string_view what) {
  const std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      return invalid_argument(fmt::format(
          "history {}: damaged or not a database ({}); move it aside and dlprobe starts a new "
          "one, or give --history another file",
          path.string(), detail));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return error(Errc::unavailable,
                   fmt::format("history {}: locked by another process beyond the busy timeout "
                               "({}); try again once it is done",
                               path.string(), detail));
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
      return error(Errc::io_error, fmt::format("history {}: {}: {}; check the file and its "
                                               "folder, or give --history another file",
                                               path.string(), what, detail));
    default:
      return error(Errc::io_error, fmt::format("history {}: {}: {}", path.string(), what, detail));
  }
}

class Statement {
 public:
  Statement(sqlite3* db, sqlite3_stmt* stmt, const std::filesystem::path* path)
      : db_(db), stmt_(stmt), path_(path) {}
  Statement(Statement&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), path_(other.path_) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  void bind(int i, const std::string& text) {
    sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void bind(int i, const std::optional<std::int64_t>& v) {
    if (v) {
      sqlite3_bind_int64(stmt_, i, *v);
    } else {
      sqlite3_bind_null(stmt_, i);
    }
  }
  void bind(int i, std::int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind(int i, const std::optional<double>& v) {
    if (v) {
      sqlite3_bind_double(stmt_, i, *v);
    } else {
      sqlite3_bind_null(stmt_, i);
    }
  }

  // True with a row to read, false when done.
  Result<bool> step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return sqlite_error(db_, rc, *path_, "query failed");
  }
  // Runs a statement that returns no rows.
  Status run() {
    auto r = step();
    return r ? Status::ok() : r.status();
  }

  std::string text(int i) const {
    const auto* p = sqlite3_column_text(stmt_, i);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<std::size_t>(sqlite3_column_bytes(stmt_, i)));
  }
  std::int64_t integer(int i) const { return sqlite3_column_int64(stmt_, i); }
  std::optional<std::int64_t> optional_integer(int i) const {
    if (sqlite3_column_type(stmt_, i) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_int64(stmt_, i);
  }
  std::optional<double> optional_real(int i) const {
    if (sqlite3_column_type(stmt_, i) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_double(stmt_, i);
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  const std::filesystem::path* path_;
};

// An open connection with the name it is known by, for errors.
struct Database {
  sqlite3* db;
  const std::filesystem::path& path;

  Result<Statement> prepare(const std::string& sql) const {
    sqlite3_stmt* stmt = nullptr;
    const int rc =
        sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()) + 1, &stmt, nullptr);
    if (rc != SQLITE_OK) return sqlite_error(db, rc, path, "cannot read");
    return Statement(db, stmt, &path);
  }
  // Runs one or more statements that return no rows.
  Status execute(const std::string& sql) const {
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return sqlite_error(db, rc, path, "cannot write");
    return Status::ok();
  }
  Result<std::int64_t> single_integer(const std::string& sql) const {
    DLPROBE_ASSIGN_OR_RETURN(Statement s, prepare(sql));
    DLPROBE_ASSIGN_OR_RETURN(const bool row, s.step());
    return row ? s.integer(0) : 0;
  }
  Result<std::int64_t> pragma_integer(std::string_view name) const {
    return single_integer(fmt::format("PRAGMA {}", name));
  }
};

}  // namespace dlprobe::history
