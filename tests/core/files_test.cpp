// Whole-file reads and atomic rewrites.
#include "dlprobe/core/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/temp_folder.h"

namespace dlprobe {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  testing::TempFolder dir_;
};

TEST_F(FilesTest, WriteThenReadGivesTheBytes) {
  const std::string content("line one\n\0binary\xff", 17);
  ASSERT_TRUE(write_file_atomic(dir_ / "a.bin", content).is_ok());
  auto back = read_whole_file(dir_ / "a.bin");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(*back, content);
}

TEST_F(FilesTest, RewriteReplacesAndLeavesNoTemporary) {
  ASSERT_TRUE(write_file_atomic(dir_ / "a.json", std::string(100'000, 'x')).is_ok());
  ASSERT_TRUE(write_file_atomic(dir_ / "a.json", "short").is_ok());
  EXPECT_EQ(read_whole_file(dir_ / "a.json").value(), "short");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

// A name at the file system's 255-byte limit is written: the temporary's name is not the file's
// with a suffix (which did not fit).
TEST_F(FilesTest, ANameAtTheLengthLimitIsWritten) {
  const std::string name = std::string(250, 'r') + ".json";
  ASSERT_TRUE(write_file_atomic(dir_ / name, "x").is_ok());
  ASSERT_TRUE(write_file_atomic(dir_ / name, "y").is_ok());
  EXPECT_EQ(read_whole_file(dir_ / name).value(), "y");
}

TEST_F(FilesTest, LargeFileReadsWhole) {
  std::string big(300'000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(write_file_atomic(dir_ / "big", big).is_ok());
  EXPECT_EQ(read_whole_file(dir_ / "big").value(), big);
}

TEST_F(FilesTest, MissingFileIsNotFound) {
  auto r = read_whole_file(dir_ / "none");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::not_found);
  EXPECT_NE(r.status().message().find("none"), std::string::npos);
}

TEST_F(FilesTest, UnwritableFolderIsAnIoErrorNamingThePath) {
  const Status s = write_file_atomic(dir_ / "no" / "such" / "x.json", "x");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Errc::io_error);
  // The error starts with the path asked for, not the temporary written beside it.
  EXPECT_EQ(s.message().rfind((dir_ / "no" / "such" / "x.json").string() + ": cannot create ", 0),
            0u)
      << s.message();
}

unsigned mode_of(const std::filesystem::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST_F(FilesTest, RewriteKeepsThePermissionsOfTheFileItReplaces) {
  const auto path = dir_ / "private.json";
  ASSERT_TRUE(write_file_atomic(path, "first").is_ok());
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ASSERT_TRUE(write_file_atomic(path, "second").is_ok());
  EXPECT_EQ(mode_of(path), 0600u);
  ASSERT_EQ(::chmod(path.c_str(), 0664), 0);
  ASSERT_TRUE(write_file_atomic(path, "third").is_ok());
  EXPECT_EQ(mode_of(path), 0664u);
  EXPECT_EQ(read_whole_file(path).value(), "third");
}

TEST_F(FilesTest, NewFileGetsWhatTheUmaskLeaves) {
  const mode_t before = ::umask(002);
  const Status s = write_file_atomic(dir_ / "new.json", "x");
  ::umask(before);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(mode_of(dir_ / "new.json"), 0664u);
}

TEST_F(FilesTest, ALinkIsFollowedAndStaysALink) {
  std::filesystem::create_directories(dir_ / "kept");
  std::filesystem::create_symlink("kept/target.json", dir_ / "link.json");
  // A link to nothing yet: the file it names is created, as the shell's `>` does.
  ASSERT_TRUE(write_file_atomic(dir_ / "link.json", "first").is_ok());
  ASSERT_TRUE(write_file_atomic(dir_ / "link.json", "second").is_ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "link.json"));
  EXPECT_EQ(read_whole_file(dir_ / "kept" / "target.json").value(), "second");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_ / "kept")) {
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(FilesTest, DashIsStandardOutput) {
  const auto captured = dir_ / "stdout.txt";
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  const int file = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(file, 0);
  ::dup2(file, STDOUT_FILENO);
  ::close(file);
  const Status s = write_file_atomic("-", "on stdout\n");
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(read_whole_file(captured).value(), "on stdout\n");
  EXPECT_FALSE(std::filesystem::exists("-"));
}

TEST_F(FilesTest, AFileThatHoldsSomethingIsReplacedOnlyWhenAllowed) {
  const auto path = dir_ / "results.json";
  EXPECT_TRUE(check_writable(path, false).is_ok());
  ASSERT_TRUE(write_file_atomic(path, "").is_ok());
  EXPECT_TRUE(check_writable(path, false).is_ok());  // empty: nothing to lose
  ASSERT_TRUE(write_file_atomic(path, "{}").is_ok());
  const Status refused = check_writable(path, false);
  EXPECT_EQ(refused.code(), Errc::invalid_argument);
  EXPECT_EQ(refused.message(),
            path.string() + ": exists and is not empty (--overwrite replaces it)");
  EXPECT_TRUE(check_writable(path, true).is_ok());
  EXPECT_TRUE(check_writable("-", false).is_ok());
  EXPECT_NE(check_writable(dir_.path(), true).message().find("is a folder"), std::string::npos);
}

TEST_F(FilesTest, TwoOutputsOnOneFileAreRefused) {
  const auto a = dir_ / "a.json";
  std::filesystem::create_symlink("a.json", dir_ / "link.json");
  const NamedOutput distinct[] = {{"--json", a}, {"--csv", dir_ / "a.csv"}, {"--md", ""}};
  EXPECT_TRUE(check_outputs(distinct, false).is_ok());
  const NamedOutput linked[] = {{"--json", a}, {"--csv", dir_ / "link.json"}};
  EXPECT_EQ(check_outputs(linked, false).message(), "--json and --csv both name " +
                                                        (dir_ / "link.json").string() +
                                                        ": give each a file of its own");
  const NamedOutput dotted[] = {{"--json", a}, {"--csv", dir_ / "." / "a.json"}};
  EXPECT_FALSE(check_outputs(dotted, false).is_ok());
  const NamedOutput dashes[] = {{"--json", "-"}, {"--csv", "-"}};
  EXPECT_EQ(check_outputs(dashes, false).message(),
            "--json and --csv cannot both write to standard output ('-')");
  const NamedOutput missing[] = {{"--json", dir_ / "no" / "a.json"}};
  EXPECT_EQ(check_outputs(missing, false).message().rfind("--json: ", 0), 0u);
}

// Names relative to the working folder, of files not yet written: the same file however spelled.
TEST_F(FilesTest, TwoSpellingsOfOneNewFileAreRefused) {
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(dir_.path());
  std::filesystem::create_directory("sub");
  const NamedOutput dot[] = {{"--json", "./same.json"}, {"--md", "same.json"}};
  const NamedOutput up[] = {{"--json", "sub/../z.json"}, {"--md", "z.json"}};
  const NamedOutput absolute[] = {{"--json", dir_ / "a.json"}, {"--md", "a.json"}};
  const NamedOutput distinct[] = {{"--json", "same.json"}, {"--md", "sub/same.json"}};
  const Status dot_status = check_outputs(dot, false);
  const Status up_status = check_outputs(up, false);
  const Status absolute_status = check_outputs(absolute, false);
  const Status distinct_status = check_outputs(distinct, false);
  std::filesystem::current_path(before);
  EXPECT_EQ(dot_status.message(),
            "--json and --md both name same.json: give each a file of its own");
  EXPECT_FALSE(up_status.is_ok());
  EXPECT_FALSE(absolute_status.is_ok());
  EXPECT_TRUE(distinct_status.is_ok()) << distinct_status.message();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "same.json"));
}

TEST_F(FilesTest, AnOutputThatNamesAnInputIsRefused) {
  const auto in = dir_ / "in.json";
  std::filesystem::create_symlink("in.json", dir_ / "link.json");
  const NamedOutput inputs[] = {{"--input", in}, {"--weights", ""}};
  const NamedOutput other[] = {{"--output", dir_ / "out.json"}};
  EXPECT_TRUE(check_outputs(other, true, inputs).is_ok());
  const NamedOutput same[] = {{"--output", dir_ / "out.json"}, {"--state", dir_ / "link.json"}};
  EXPECT_EQ(check_outputs(same, true, inputs).message(),
            "--input and --state both name " + (dir_ / "link.json").string() +
                ": the output would replace what the command reads");
}

// A named pipe that nothing writes to is refused at once (opening it had waited for a writer
// forever); a pipe whose writer is there is read to its end, as `<(cat file)` gives one.
TEST_F(FilesTest, APipeIsReadWhenWrittenAndRefusedWhenNot) {
  const auto fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Result<std::string> none = read_whole_file(fifo);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.status().message(),
            fifo.string() + ": a pipe that gave no data (nothing writes to it)");
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  ASSERT_EQ(::write(ends[1], "abc", 3), 3);
  ::close(ends[1]);  // what was written stays in the pipe, and then it ends
  const Result<std::string> written = read_whole_file("/proc/self/fd/" + std::to_string(ends[0]));
  ::close(ends[0]);
  ASSERT_TRUE(written.has_value()) << written.status().message();
  EXPECT_EQ(*written, "abc");
}

TEST_F(FilesTest, ReadingAFolderIsAnIoError) {
  auto r = read_whole_file(dir_.path());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), Errc::io_error);
}

// Sets an environment variable (or unsets it, for null) for the scope, then puts it back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(XdgFile, TheVariableThenHomeThenAnErrorNamingTheFlag) {
  {
    ScopedEnv xdg("XDG_TEST_HOME", "/x/y");
    EXPECT_EQ(xdg_file("XDG_TEST_HOME", ".test", "f.json", "test", "--f FILE").value(),
              "/x/y/dlprobe/f.json");
  }
  {
    ScopedEnv xdg("XDG_TEST_HOME", "relative");  // not absolute: ignored, as the spec says
    ScopedEnv home("HOME", "/home/u");
    EXPECT_EQ(xdg_file("XDG_TEST_HOME", ".local/share", "f.json", "test", "--f FILE").value(),
              "/home/u/.local/share/dlprobe/f.json");
  }
  ScopedEnv xdg("XDG_TEST_HOME", nullptr);
  ScopedEnv home("HOME", "");
  auto none = xdg_file("XDG_TEST_HOME", ".test", "f.json", "test", "--f FILE");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), Errc::not_found);
  EXPECT_EQ(none.status().message(),
            "no test folder: XDG_TEST_HOME is not set and HOME is not set (give --f FILE)");
  ScopedEnv relative("XDG_TEST_HOME", "rel/xdg");
  EXPECT_EQ(xdg_file("XDG_TEST_HOME", ".test", "f.json", "test", "--f FILE").status().message(),
            "no test folder: XDG_TEST_HOME is relative (rel/xdg), which does not count, and HOME "
            "is not set (give --f FILE)");
}

}  // namespace
}  // namespace dlprobe
