// Chrome trace-event JSON (the "JSON Array Format": Perfetto and
// chrome://tracing open it, even unterminated after a crash). One process per
// rank; thread 0 is the training thread (compute, wait), thread 1 the engine
// (bucket all-reduces), thread 2 gradient readiness.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::fusion {

class Timeline {
 public:
  Timeline(const std::string& path, int rank);
  ~Timeline();
  bool on() const { return out_.is_open(); }
  // A span [begin_us, end_us) on a thread, with optional args.
  void span(int tid, const std::string& name, const char* category, double begin_us, double end_us,
            nlohmann::json args = nullptr);
  void instant(int tid, const std::string& name, const char* category, double at_us);
  void flush() { out_.flush(); }

 private:
  void emit(const nlohmann::json& event);
  std::ofstream out_;
  int rank_;
  bool first_ = true;
};

}  // namespace tandem::fusion
