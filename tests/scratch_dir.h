// Temporary files of a test stay inside its scratch directory: scratch_dir.cc
// points TMPDIR there, and these name templates follow TMPDIR.
#pragma once

#include <filesystem>
#include <string>

namespace tandem::testing {

// A mkstemp / mkdtemp template ("<scratch>/<stem>-XXXXXX").
inline std::string scratch_template(const std::string& stem) {
  return (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
}

}  // namespace tandem::testing
