// Fuzz target: the collective fingerprint a rank receives from its ring
// predecessor over UCX (comm/src/call_description.h): 24 bytes from another
// process, compared with this rank's and described in the CollectiveMismatch
// message. The private header is included so its types are reachable.
#include <cstdlib>
#include <cstring>

#include "call_description.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::Fingerprint;
  if (size < 2 * sizeof(Fingerprint)) return 0;
  Fingerprint mine, theirs;
  std::memcpy(&mine, data, sizeof mine);
  std::memcpy(&theirs, data + sizeof mine, sizeof theirs);
  const char* field = mine.differing(theirs);
  if ((field == nullptr) != (theirs.differing(mine) == nullptr)) std::abort();
  const std::string text = theirs.description().str() + mine.description().str();
  if (text.empty()) std::abort();
  return 0;
}
