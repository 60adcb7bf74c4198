// How a fully-connected layer's weight (out x in) is cut into row blocks for
// hyperparameters.layer_slices (model.h): as even as they can be with every
// block but the last holding a multiple of 16 elements (64 bytes of f32, so
// the blocks lie back to back in the fusion arena). Torch-free, so the
// config check and the model share one rule.
#pragma once

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem::trainer {

// Rows that hold a multiple of 16 elements.
inline int64_t row_block_unit(int64_t in) { return 16 / std::gcd(in, int64_t{16}); }

// The most blocks an out x in weight can be cut into.
inline int64_t most_row_blocks(int64_t in, int64_t out) { return out / row_block_unit(in); }

// Row boundaries of `slices` blocks (slices + 1 of them). Throws
// std::invalid_argument if that would leave a block empty.
inline std::vector<int64_t> row_block_bounds(int64_t in, int64_t out, int slices) {
  const int64_t unit = row_block_unit(in);
  if (slices < 1 || slices > most_row_blocks(in, out))
    throw std::invalid_argument("a layer of " + std::to_string(out) + " outputs cannot be cut into " +
                                std::to_string(slices) + " blocks of whole multiples of " + std::to_string(unit) +
                                " rows (" + std::to_string(unit * in) + " elements)");
  std::vector<int64_t> bounds{0};
  for (int k = 1; k < slices; ++k) bounds.push_back(out * k / slices / unit * unit);
  bounds.push_back(out);
  return bounds;
}

}  // namespace tandem::trainer
