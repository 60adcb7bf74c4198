// Gives each test program a temporary directory of its own: TMPDIR points into
// it while the tests run (forked ranks and spawned tools inherit it), and a
// passing run removes it; a failing run keeps it, with its flight-recorder dumps.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace {

namespace fs = std::filesystem;

class ScratchDir : public ::testing::Environment {
 public:
  void SetUp() override {
    std::error_code error;
    fs::path parent = fs::temp_directory_path(error);  // CTest points TMPDIR into the build directory
    if (error) parent = "/tmp";
    const fs::path program = fs::read_symlink("/proc/self/exe", error);
    std::string pattern =
        (parent / ("tandem-" + (error ? std::string("test") : program.filename().string()) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror(("cannot create a temporary directory " + pattern).c_str());
      return;
    }
    dir_ = pattern;
    owner_ = ::getpid();
    if (const char* old = std::getenv("TMPDIR")) previous_ = old;
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }

  void TearDown() override {
    if (dir_.empty() || ::getpid() != owner_) return;  // a forked rank leaves the directory to its parent
    if (previous_) {
      ::setenv("TMPDIR", previous_->c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
    if (!::testing::UnitTest::GetInstance()->Passed()) {
      std::fprintf(stderr, "kept the test's temporary directory for inspection: %s\n", dir_.c_str());
      return;
    }
    std::error_code error;
    fs::remove_all(dir_, error);
    if (error) std::fprintf(stderr, "cannot remove %s: %s\n", dir_.c_str(), error.message().c_str());
  }

 private:
  std::string dir_;
  pid_t owner_ = 0;
  std::optional<std::string> previous_;
};

[[maybe_unused]] ::testing::Environment* const scratch_dir = ::testing::AddGlobalTestEnvironment(new ScratchDir);

}  // namespace
