#include "engine/asymmetric_fence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace tandem {
namespace {

long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }

}  // namespace

bool heavy_fences_available() {
  static const bool available = [] {
    const long commands = membarrier(MEMBARRIER_CMD_QUERY);
    return commands > 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
           membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  }();
  return available;
}

void heavy_fence() { membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED); }

}  // namespace tandem
