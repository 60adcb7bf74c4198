// An environment for tests: variables in a map, looked up as the settings
// readers look up the process environment.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "tandem/bootstrap.h"

namespace tandem {

using Env = std::map<std::string, std::string>;

inline EnvLookup lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace tandem
