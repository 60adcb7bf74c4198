#include "flags.h"

#include <cctype>
#include <limits>

namespace tandem::cli {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<size_t> parse_size(std::string_view text) {
  size_t i = 0;
  size_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    size_t digit = static_cast<size_t>(text[i] - '0');
    if (value > (std::numeric_limits<size_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return std::nullopt;
  std::string suffix = lower(text.substr(i));
  if (!suffix.empty() && suffix.back() == 'b') suffix.pop_back();
  int shift = 0;
  if (suffix == "k")
    shift = 10;
  else if (suffix == "m")
    shift = 20;
  else if (suffix == "g")
    shift = 30;
  else if (!suffix.empty())
    return std::nullopt;
  if (shift > 0 && value > (std::numeric_limits<size_t>::max() >> shift)) return std::nullopt;
  return value << shift;
}

size_t size_flag(const std::string& flag, const std::string& text) {
  auto v = parse_size(text);
  if (!v)
    throw UsageError(flag + ": '" + text +
                     "' is not a size; use bytes with an optional K, M or G suffix (e.g. 8, 4K, 128M)");
  return *v;
}

}  // namespace tandem::cli
