// Training data: Fashion-MNIST read from its IDX files (gzip-compressed, as
// the Debian package dataset-fashion-mnist ships them), or synthetic images.
//
// Terms:
//  - record: one image and its label.
//  - epoch order: a permutation of the first records_per_epoch records,
//    drawn from (seed, epoch) alone, so every slot computes the same one.
//  - batch: global_batch records of the epoch order, in order; slot r of n
//    trains the r-th of n contiguous slices (its shard): per_slot records when
//    n divides the global batch, else slices differing by one record (after an
//    elastic trial lost a slot). The partial global batch
//    at an epoch's end is dropped. Batch b of the trial depends only on
//    (seed, b), which is the whole data position a checkpoint needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::trainer {

struct Dataset {
  int64_t size = 0;
  int rows = 28, cols = 28;
  std::vector<uint8_t> images;  // size * rows * cols, row-major
  std::vector<uint8_t> labels;  // size, 0..9
  int64_t pixels() const { return int64_t{rows} * cols; }
};

// Reads an IDX image file (magic 0x803) and label file (0x801), plain or gzip.
// Throws std::runtime_error naming the file and what is wrong with it.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);

// Fashion-MNIST's train (60000) or test (10000) split from `dir`.
Dataset load_fashion_mnist(const std::string& dir, bool train);

// Learnable stand-in of the same shape: each class a fixed random template
// plus per-record noise (tells data loading apart from communication). The
// train and test splits share the templates, not the records.
Dataset synthetic_dataset(int64_t size, uint64_t seed, bool train);

class BatchPlan {
 public:
  BatchPlan(int64_t records_per_epoch, int64_t global_batch, uint64_t seed);
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t epoch_of(int64_t batch) const { return batch / batches_per_epoch_; }
  int64_t global_batch() const { return global_; }
  // Record indices slot `slot` of `slots` trains in trial batch `batch`.
  std::vector<int64_t> shard(int64_t batch, int slot, int slots);

 private:
  const std::vector<int64_t>& order(int64_t epoch);
  int64_t records_, global_, batches_per_epoch_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

// The contiguous part [begin, end) of `size` records validated by `slot` of `slots`.
std::pair<int64_t, int64_t> validation_range(int64_t size, int slot, int slots);

}  // namespace tandem::trainer
