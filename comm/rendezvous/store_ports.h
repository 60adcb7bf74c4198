// The store ports tandem derives where a launcher gives no address.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem {

// A one-node job's store port from its launcher's job id (mpirun, Hydra).
uint16_t port_from_job_id(std::string_view job_id);

}  // namespace tandem
