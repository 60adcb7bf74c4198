// Text and JSON forms of interfaces and probes, shared by interface selection
// (netif_select.cc) and its reports (netif_report.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tandem/netif.h"

namespace tandem::netif {

std::string fmt_gbps(double g);
std::string fmt_us(double us);

nlohmann::json to_j(const NetInterface& i);
NetInterface interface_from(const nlohmann::json& j);
nlohmann::json to_j(const PairProbe& p);
PairProbe probe_from(const nlohmann::json& j);

}  // namespace tandem::netif
