#include "data.h"

#include <zlib.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace tandem::trainer {
namespace {

// The whole file, decompressed when it is gzip (zlib reads plain files as is).
std::vector<uint8_t> read_all(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open '" + path + "'; is the package dataset-fashion-mnist installed?");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string error = (n < 0 || (err != Z_OK && err != Z_STREAM_END)) ? std::string(msg ? msg : "read error") : "";
  gzclose(f);
  if (!error.empty()) throw std::runtime_error("'" + path + "' is corrupt: " + error);
  return out;
}

uint32_t be32(const std::vector<uint8_t>& d, size_t at) {
  return (uint32_t{d[at]} << 24) | (uint32_t{d[at + 1]} << 16) | (uint32_t{d[at + 2]} << 8) | d[at + 3];
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  const auto img = read_all(images_path);
  const auto lab = read_all(labels_path);
  if (img.size() < 16 || be32(img, 0) != 0x803)
    throw std::runtime_error("'" + images_path + "' is not an IDX image file (magic 0x00000803)");
  if (lab.size() < 8 || be32(lab, 0) != 0x801)
    throw std::runtime_error("'" + labels_path + "' is not an IDX label file (magic 0x00000801)");
  Dataset d;
  d.size = be32(img, 4);
  d.rows = static_cast<int>(be32(img, 8));
  d.cols = static_cast<int>(be32(img, 12));
  if (be32(lab, 4) != d.size)
    throw std::runtime_error("'" + images_path + "' holds " + std::to_string(d.size) + " images but '" + labels_path +
                             "' " + std::to_string(be32(lab, 4)) + " labels");
  if (img.size() != 16 + static_cast<size_t>(d.size * d.pixels()) || lab.size() != 8 + static_cast<size_t>(d.size))
    throw std::runtime_error("'" + images_path + "' or '" + labels_path + "' is truncated");
  d.images.assign(img.begin() + 16, img.end());
  d.labels.assign(lab.begin() + 8, lab.end());
  for (uint8_t l : d.labels)
    if (l > 9) throw std::runtime_error("'" + labels_path + "' has label " + std::to_string(l) + " outside 0..9");
  return d;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string p = dir + (train ? "/train" : "/t10k");
  return load_idx(p + "-images-idx3-ubyte.gz", p + "-labels-idx1-ubyte.gz");
}

Dataset synthetic_dataset(int64_t size, uint64_t seed, bool train) {
  Dataset d;
  d.size = size;
  std::mt19937_64 template_rng(seed ^ 0x5eedda7aULL);
  std::vector<uint8_t> templates(10 * d.pixels());
  for (auto& t : templates) t = static_cast<uint8_t>(template_rng() % 256);
  std::mt19937_64 rng(seed * 2 + (train ? 0 : 1));
  d.images.resize(size * d.pixels());
  d.labels.resize(size);
  for (int64_t i = 0; i < size; ++i) {
    const int label = static_cast<int>(rng() % 10);
    d.labels[i] = static_cast<uint8_t>(label);
    for (int64_t p = 0; p < d.pixels(); ++p) {
      int v = templates[label * d.pixels() + p] / 2 + static_cast<int>(rng() % 128);
      d.images[i * d.pixels() + p] = static_cast<uint8_t>(v);
    }
  }
  return d;
}

BatchPlan::BatchPlan(int64_t records_per_epoch, int64_t global_batch, uint64_t seed)
    : records_(records_per_epoch), global_(global_batch), seed_(seed) {
  if (global_ <= 0 || records_ < global_)
    throw std::invalid_argument("records_per_epoch " + std::to_string(records_) + " is smaller than the global batch " +
                                std::to_string(global_));
  batches_per_epoch_ = records_ / global_;
}

const std::vector<int64_t>& BatchPlan::order(int64_t epoch) {
  if (epoch != cached_epoch_) {
    order_.resize(records_);
    std::iota(order_.begin(), order_.end(), 0);
    // Fisher-Yates with a fixed generator and our own bounded draw: the same on every slot and build.
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(epoch) + 1);
    for (int64_t i = records_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order_[i], order_[j]);
    }
    cached_epoch_ = epoch;
  }
  return order_;
}

std::vector<int64_t> BatchPlan::shard(int64_t batch, int slot, int slots) {
  const auto& o = order(epoch_of(batch));
  const int64_t first = (batch % batches_per_epoch_) * global_;
  return std::vector<int64_t>(o.begin() + first + global_ * slot / slots,
                              o.begin() + first + global_ * (slot + 1) / slots);
}

std::pair<int64_t, int64_t> validation_range(int64_t size, int slot, int slots) {
  return {size * slot / slots, size * (slot + 1) / slots};
}

}  // namespace tandem::trainer
