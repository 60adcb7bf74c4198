// Fuzz target: a peer's shared-memory slot header and control block, as a
// rank reads them from the peer's segment (ring/src/shm_wire.h): the
// bytes of another rank's Call, compared with this rank's and printed into
// the CollectiveMismatch message.
#include <cstdlib>
#include <cstring>

#include "shm_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::ring::Call;
  using tandem::ring::SlotHeader;
  if (size < 2 * sizeof(SlotHeader)) return 0;
  SlotHeader mine, theirs;
  std::memcpy(&mine, data, sizeof mine);
  std::memcpy(&theirs, data + sizeof mine, sizeof theirs);
  const std::string a = mine.call.str(), b = theirs.call.str();
  if (a.empty() || b.empty()) std::abort();
  // Equal calls print equally.
  if (mine.call == theirs.call && a != b) std::abort();
  tandem::ring::Control control;
  std::memcpy(&control, data, std::min(size, sizeof control));
  if (control.call.str().empty()) std::abort();
  return 0;
}
