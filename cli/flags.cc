#include "flags.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>

namespace tandem::cli {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<size_t> parse_size(std::string_view text) {
  // CLI11 reads the suffix (K, M, G, ... with an optional B, powers of 1024) but
  // passes a value without one through unchecked and reads a bare suffix as 1 of
  // it; so the value must start with a digit and end up as digits alone.
  static const CLI::AsSizeValue as_size(false);
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  std::string bytes(text);
  try {
    if (!as_size(bytes).empty()) return std::nullopt;
  } catch (const CLI::ValidationError&) {  // an unknown suffix, or a product past 64 bits
    return std::nullopt;
  }
  size_t value = 0;
  const auto [end, error] = std::from_chars(bytes.data(), bytes.data() + bytes.size(), value);
  if (error != std::errc() || end != bytes.data() + bytes.size()) return std::nullopt;
  return value;
}

size_t size_flag(const std::string& flag, const std::string& text) {
  auto v = parse_size(text);
  if (!v)
    throw UsageError(flag + ": '" + text +
                     "' is not a size; use bytes with an optional K, M or G suffix (e.g. 8, 4K, 128M)");
  return *v;
}

}  // namespace tandem::cli
