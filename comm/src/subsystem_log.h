// Each subsystem's own spdlog logger, so TANDEM_LOG_LEVEL=info,liveness=debug
// can set one subsystem's level (tandem/logging.h).
#pragma once

#include <spdlog/logger.h>

namespace tandem {

enum class Subsystem { comm, engine, liveness, netif, store, transport };

// The subsystem's logger, registered with spdlog under its name on first use.
spdlog::logger& subsystem_log(Subsystem subsystem);

}  // namespace tandem
