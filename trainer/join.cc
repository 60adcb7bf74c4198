// An elastic trial's growth (trial.h): a process started in a lost slot's
// place (TANDEM_JOIN=1) is admitted by the members at a step boundary and
// takes their state from memory, not from a checkpoint.
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "checkpoint.h"
#include "trial.h"

namespace tandem::trainer {
namespace {

// Seconds since this process started (/proc: its start in clock ticks after boot).
double process_age_seconds() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  double up = 0;
  uptime >> up;
  const auto end_of_name = text.rfind(')');
  if (end_of_name == std::string::npos || up <= 0) return 0;
  std::istringstream fields(text.substr(end_of_name + 2));
  std::string skipped;
  for (int field = 3; field < 22; ++field) fields >> skipped;  // the name ends field 2; the start is field 22
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return 0;
  return std::max(0.0, up - double(ticks) / double(::sysconf(_SC_CLK_TCK)));
}

std::string listed(const std::vector<int>& numbers) {
  std::string out;
  for (int n : numbers) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

}  // namespace

void Trial::offer_joiners() {
  // A store read every step would cost the chief more than a grow per second saves.
  constexpr auto kJoinersProbe = std::chrono::milliseconds(250);
  if (!cfg_.elastic() || !chief_ || world_ >= cfg_.elastic_max() || SteadyClock::now() < next_joiners_probe_) return;
  next_joiners_probe_ = SteadyClock::now() + kJoinersProbe;
  try {
    exchange_->offer_joiners(comm_->joiners_waiting());
  } catch (const tandem::Error&) {  // the store unreachable: the step's own calls will say so
  }
}

void Trial::admit_joiners(int64_t batch) {
  const auto asked = SteadyClock::now();
  joiners_waiting_ = 0;  // the grow claims them
  Communicator::Grown grown;
  try {
    grown = comm_->grow(cfg_.elastic_max() - world_);
  } catch (const tandem::Excluded&) {
    throw;
  } catch (const tandem::Error& e) {  // a joiner lost before it was wired up: this communicator is whole
    if (chief_)
      std::fprintf(stderr, "elastic: no slot joined at batch %lld (%s); %d slots go on\n",
                   static_cast<long long>(batch), e.what(), world_);
    return;
  }
  ++grow_calls_, grow_seconds_ += seconds_since(asked);
  if (!grown.comm) return;
  const std::unique_ptr<Communicator> old = std::move(comm_);  // outlives the old sync, in rebind()
  comm_ = std::move(grown.comm);
  const int members = world_;
  rank_ = comm_->rank(), world_ = comm_->size();
  exchange_->rebind(*comm_);
  stalls_ = std::make_unique<StallReporter>(wo_.stall_factor, world_, log_.get());
  previous_arrival_ = 0;
  const int own = originals_[size_t(rank_)];
  originals_.resize(size_t(world_), -1);
  const double joiner_age = share_numbers(own, 0);
  const auto sharing = SteadyClock::now();
  const size_t bytes = share_state(false);
  const double state_seconds = seconds_since(sharing);
  MembershipRecord m{batch, now(), {}, "admitted", 0, 0, world_, {}, 0, 0};
  m.joined.assign(originals_.begin() + members, originals_.end());
  m.state_bytes = int64_t(bytes), m.state_seconds = state_seconds;
  // Its recovery: from the joiner's process start to the next committed step.
  changes_.push_back({m, SteadyClock::now() - std::chrono::duration_cast<SteadyClock::duration>(
                                                  std::chrono::duration<double>(joiner_age))});
  if (chief_)
    std::fprintf(stderr,
                 "elastic: slot %s joined at batch %lld, %.2f s after it started; %d slots go on (grow %.3f s, "
                 "state %zu bytes in %.3f s)\n",
                 listed(m.joined).c_str(), static_cast<long long>(batch), joiner_age, world_,
                 std::chrono::duration<double>(sharing - asked).count(), bytes, state_seconds);
}

void Trial::take_members_state() {
  share_numbers(originals_[size_t(rank_)], process_age_seconds());
  share_state(true);
}

double Trial::share_numbers(int own_number, double own_age) {
  std::vector<double> v(size_t(world_) + 1, -1.0);  // a double holds every number exactly
  v[size_t(rank_)] = own_number;
  v.back() = own_age;
  comm_->allreduce(v.data(), v.size(), DataType::f64, ReduceOp::max);
  originals_.assign(v.begin(), v.end() - 1);
  return v.back();
}

size_t Trial::share_state(bool take) {
  torch::NoGradGuard no_grad;
  // What the members hold besides the parameters and optimizer state: the
  // cursors, the trial clock's origin, the records counted by epoch.
  const double origin = std::chrono::duration<double>(origin_->time_since_epoch()).count();
  int64_t cursors[8] = {committed_, start_, first_epoch_counted_, next_epoch_checked_, last_validation_logged_};
  std::memcpy(&cursors[5], &origin, sizeof origin);
  std::vector<int64_t> epochs;
  for (const auto& [e, n] : epoch_records_) epochs.push_back(e), epochs.push_back(n);
  std::vector<char> bytes;
  if (rank_ == 0) {
    c10::List<at::Tensor> params;
    for (const auto& p : params_) params.push_back(p.detach());
    bytes = torch::pickle_save(c10::ivalue::Tuple::create({optimizer_state(*optimizer_), params}));
  }
  cursors[6] = int64_t(epochs.size()), cursors[7] = int64_t(bytes.size());
  comm_->broadcast(cursors, 8, DataType::i64, 0);
  epochs.resize(size_t(cursors[6]));
  bytes.resize(size_t(cursors[7]));
  if (!epochs.empty()) comm_->broadcast(epochs.data(), epochs.size(), DataType::i64, 0);
  comm_->broadcast(bytes.data(), bytes.size(), DataType::u8, 0);
  if (!take) return bytes.size();

  committed_ = cursors[0], start_ = cursors[1], first_epoch_counted_ = cursors[2], next_epoch_checked_ = cursors[3];
  last_validation_logged_ = cursors[4];
  double members_origin = 0;
  std::memcpy(&members_origin, &cursors[5], sizeof members_origin);
  origin_ = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(members_origin)));
  epoch_records_.clear();
  for (size_t i = 0; i + 1 < epochs.size(); i += 2) epoch_records_[epochs[i]] = epochs[i + 1];
  const auto state = torch::pickle_load(bytes).toTuple();
  const auto params = state->elements()[1].toTensorList();
  if (params.size() != params_.size())
    throw std::logic_error("the members' state holds " + std::to_string(params.size()) + " parameters, not " +
                           std::to_string(params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(params.get(i));
  LoadedCheckpoint copy;
  copy.path = "the members' state";
  copy.optimizer = state->elements()[0];
  optimizer_->state().clear();
  restore_optimizer(copy, *optimizer_);
  return bytes.size();
}

}  // namespace tandem::trainer
