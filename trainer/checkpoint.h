// Checkpoint files: named byte blobs (model, optimizer, data position, RNG)
// in one file with a length and a CRC-32 over everything after the header.
//
// A checkpoint is written atomically: to a temporary file in the same
// directory, fsync'd, renamed over its final name, and the directory fsync'd.
// A reader checks magic, version, length and checksum; a file that fails any
// of them (torn by a crash, truncated, overwritten) is rejected, never loaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::trainer {

struct CorruptCheckpoint : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Blobs = std::map<std::string, std::string>;

void write_checkpoint(const std::string& path, const Blobs& blobs);
// Throws CorruptCheckpoint naming the file and the check that failed.
Blobs read_checkpoint(const std::string& path);

// Checkpoints in `dir` are named ckpt-<batch>.tck. The newest one that reads
// back intact, with its batch; torn ones are skipped with a warning each.
struct Found {
  int64_t batch = 0;
  std::string path;
  Blobs blobs;
};
std::optional<Found> latest_checkpoint(const std::string& dir, std::vector<std::string>* warnings = nullptr);
std::string checkpoint_path(const std::string& dir, int64_t batch);
// Keeps the `keep` newest checkpoints of `dir`, removes the rest.
void prune_checkpoints(const std::string& dir, size_t keep);

}  // namespace tandem::trainer
