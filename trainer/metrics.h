// Trial metrics: the JSON-lines file the chief writes, the stall detector,
// and what is made of the file afterwards (progress line, summary, plots).
//
// Terms:
//  - batch: one backward pass of the global batch (searcher.max_length counts
//    these); with aggregation_frequency k an optimizer step is k batches.
//  - step time: wall time of one batch on the chief, split into data
//    (loading the shard), compute (forward + backward, less data),
//    exposed (blocked waiting for communication) and the rest.
//  - hidden: 1 - exposed / communication time, over communicating batches.
//  - stall: a batch slower than k times the median of the recent ones.
//
// Line kinds ("kind"): train, validation, stall, checkpoint, restart, end;
// an elastic trial's also epoch (records trained) and membership (slots lost or joined).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::trainer {

struct TrainRecord {
  int64_t batch = 0;  // 1-based count of batches trained
  int64_t epoch = 0;
  double time = 0;  // seconds since the trial started (across restarts)
  double loss = 0, accuracy = 0;
  double samples_per_s = 0;
  double step = 0, data = 0, compute = 0, exposed = 0, communication = 0;
  bool communicated = true;
};

struct ValidationRecord {
  int64_t batch = 0;
  double time = 0;  // when the result was known on every rank
  double loss = 0, accuracy = 0;
  int64_t records = 0;
  double seconds = 0;          // the whole pass: batches, forward, loss, the all-reduce
  double forward_seconds = 0;  // of it, in the model's forward alone
};

// Elastic: the records an epoch trained, counted from the slots' shares of each committed step.
struct EpochRecords {
  int64_t epoch = 0;
  int64_t records = 0, expected = 0;  // expected: the epoch's global batches' records
};

// Elastic: a slot lost and the survivors going on, or processes joining them.
struct MembershipRecord {
  int64_t batch = 0;      // in flight when the failure was seen; a join: the batch the joiners train first
  double time = 0;        // the trial clock then
  std::vector<int> lost;  // the slots lost (their numbers in the job: ranks at the start, or a joiner's)
  std::string reason;     // the error the survivors saw; a join: "admitted"
  // To the next committed step (or the trial's end) from the failure seen; a join: from the joiner's process start.
  double recovery_seconds = 0;
  int64_t batches_redone = 0;
  int slots = 0;                                    // after
  std::vector<int> joined;                          // the joiners' numbers in the job (TANDEM_RANK)
  int64_t state_bytes = 0;                          // a join: the state broadcast to the joiners
  double state_seconds = 0;                         // and its time
  bool is_join() const { return !joined.empty(); }  // else slots were lost
};

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Appends; keeps the lines of batches <= keep_upto_batch (a resumed run, or a
  // chief taking over after a shrink) and every start line, or truncates when < 0.
  // A line that does not parse (torn by a crash) is dropped.
  MetricsWriter(const std::string& path, int64_t keep_upto_batch);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void train(const TrainRecord& r);
  void validation(const ValidationRecord& r);
  void stall(const TrainRecord& r, double median, int last_rank, double last_rank_compute);
  void line(const std::string& json);  // any other kind, already JSON
  // Of the lines kept when opened: the integer `field` of the last line of `kind`, if any.
  std::optional<int64_t> last_kept(const std::string& kind, const std::string& field) const;

 private:
  FILE* f_ = nullptr;
  std::map<std::string, std::string> last_kept_;  // by kind
};

class StallDetector {
 public:
  StallDetector(double factor, size_t window) : factor_(factor), window_(window) {}
  // Records a step time; true when it exceeds factor x the median of the window (once it has 10 samples).
  bool add(double seconds);
  double median() const { return median_; }

 private:
  double factor_;
  size_t window_;
  std::deque<double> recent_;
  double median_ = 0;
};

// What a metrics file says.
struct TrialSummary {
  std::vector<TrainRecord> train;
  std::vector<ValidationRecord> validation;
  int stalls = 0;
  int restarts = 0;            // attempts after the first (failures the driver restarted from)
  double lost_time = 0;        // over restarts: trial time from the checkpoint resumed to the new attempt's start
  double checkpoint_wait = 0;  // end line: seconds training waited for checkpoints (the last attempt's)
  int slots = 0;
  int64_t global_batch = 0;
  double wall_time = 0;              // of the "end" line: the trial clock, over every attempt
  std::string compression = "none";  // gradients on the wire (start line)
  uint64_t gradient_bytes = 0, wire_bytes = 0, compression_fallbacks = 0;  // end line: the last attempt's
  std::vector<EpochRecords> epochs;  // by epoch, the last line of each (a step put back re-counts it)
  std::vector<MembershipRecord> membership;
  // Derived
  double samples_per_s() const;  // median over batches after the first 10%
  double mean(double TrainRecord::*field) const;
  double hidden_fraction() const;
  double time_to_accuracy(double target) const;  // first validation reaching it; < 0 = never
  double final_accuracy() const;
  double validation_seconds() const;        // mean duration of a validation pass (0 when not recorded)
  double validation_total_seconds() const;  // all passes
};

TrialSummary read_metrics(const std::string& path);
// The trial clock's origin, from the file's first start line (the first attempt's chief wrote it).
std::optional<std::chrono::system_clock::time_point> clock_origin(const std::string& metrics_path);
std::string progress_line(const TrialSummary& s, int64_t total_batches);
std::string summary_table(const TrialSummary& s, double target_accuracy);
// loss/accuracy against time and against batches, as PNGs `prefix`-time.png and `prefix`-batches.png;
// with membership changes also the slots against time, `prefix`-slots.png.
// Returns the files written, or an error message in *error (gnuplot missing...).
std::vector<std::string> plot_metrics(const TrialSummary& s, const std::string& prefix, std::string* error);

}  // namespace tandem::trainer
