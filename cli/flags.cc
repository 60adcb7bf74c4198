#include "flags.h"

#include <cctype>

#include "tandem/settings.h"

namespace tandem::cli {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

size_t size_flag(const std::string& flag, const std::string& text) {
  auto v = parse_byte_size(text);
  if (!v)
    throw UsageError(flag + ": '" + text +
                     "' is not a size; use bytes with an optional K, M or G suffix (e.g. 8, 4K, 128M)");
  return *v;
}

}  // namespace tandem::cli
