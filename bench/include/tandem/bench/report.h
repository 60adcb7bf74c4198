// How the bench tools report numbers: medians, and sizes as 4K, 16M, 1G.
#pragma once

#include <string>
#include <vector>

namespace tandem::bench {

// The median (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> values);

// Bytes in powers of 1024 with a K, M or G suffix, as nccl-tests' flags take them: 512, 4K, 1.5M.
std::string human_bytes(double bytes);

}  // namespace tandem::bench
