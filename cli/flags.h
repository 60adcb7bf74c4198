// Flag values CLI11 cannot check by itself, shared by the subcommands.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tandem::cli {

// A bad flag value; main() reports it like CLI11's own errors (exit code 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string lower(std::string_view s);

// nccl-tests sizes (tandem::parse_byte_size), or a UsageError naming the
// flag and the accepted forms.
size_t size_flag(const std::string& flag, const std::string& text);

}  // namespace tandem::cli
