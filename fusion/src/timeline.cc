#include "timeline.h"

#include "tandem/errors.h"

namespace tandem::fusion {

Timeline::Timeline(const std::string& path, int rank) : rank_(rank) {
  if (path.empty()) return;
  out_.open(path, std::ios::trunc);
  if (!out_)
    throw InvalidArgument("timeline: cannot write '" + path + "' (check the directory exists and is writable)");
  out_ << "[\n";
  const char* names[] = {"training thread", "gradient-sync engine", "gradients ready"};
  emit({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (int tid = 0; tid < 3; ++tid)
    emit({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args", {{"name", names[tid]}}}});
}

Timeline::~Timeline() {
  if (on()) out_ << "\n]\n";
}

void Timeline::emit(const nlohmann::json& event) {
  out_ << (first_ ? "" : ",\n") << event.dump();
  first_ = false;
}

void Timeline::span(int tid, const std::string& name, const char* category, double begin_us, double end_us,
                    nlohmann::json args) {
  nlohmann::json e{{"name", name},
                   {"cat", category},
                   {"ph", "X"},
                   {"pid", rank_},
                   {"tid", tid},
                   {"ts", begin_us},
                   {"dur", std::max(0.0, end_us - begin_us)}};
  if (!args.is_null()) e["args"] = std::move(args);
  emit(e);
}

void Timeline::instant(int tid, const std::string& name, const char* category, double at_us) {
  emit({{"name", name}, {"cat", category}, {"ph", "i"}, {"s", "t"}, {"pid", rank_}, {"tid", tid}, {"ts", at_us}});
}

}  // namespace tandem::fusion
