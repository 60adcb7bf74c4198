// The ring's settings table: one row per TANDEM_* variable that fills
// RingOptions, and the reader that applies it.
#include "tandem/ring/ring.h"

namespace tandem::ring {

const char* to_string(AllreduceAlgorithm a) {
  switch (a) {
    case AllreduceAlgorithm::automatic: return "auto";
    case AllreduceAlgorithm::ring: return "ring";
    case AllreduceAlgorithm::recursive_doubling: return "recursive_doubling";
    case AllreduceAlgorithm::shared_memory: return "shared_memory";
    case AllreduceAlgorithm::hierarchical: return "hierarchical";
  }
  return "unknown";
}

namespace {

const char* to_string(ShmAllreduceCma c) {
  switch (c) {
    case ShmAllreduceCma::never: return "never";
    case ShmAllreduceCma::far: return "far";
    case ShmAllreduceCma::timed: return "timed";
    case ShmAllreduceCma::always: return "always";
  }
  return "unknown";
}

Setting row(const char* variable, const char* name, SettingKind kind, const char* default_value, const char* doc,
            const char* fix = "") {
  return setting_row("ring", variable, name, kind, default_value, doc, fix);
}

SettingTable<RingOptions> make_table() {
  using K = SettingKind;
  using O = RingOptions;
  SettingTable<O> t;
  t.push_back(number_field(row("TANDEM_SEGMENT_BYTES", "segment_bytes", K::bytes, "2097152",
                               "Largest message of the ring pipeline (at least 4096).",
                               "set it to the ring's message size in bytes (>= 4096)"),
                           &O::segment_bytes));
  Setting in_flight = row("TANDEM_SEGMENTS_IN_FLIGHT", "segments_in_flight", K::count, "4",
                          "Segments walking the ring at once.", "set it to a number from 1 to 64");
  in_flight.min = 1, in_flight.max = 64;
  t.push_back(number_field(in_flight, &O::segments_in_flight));
  Setting algo = row("TANDEM_ALGO", "allreduce", K::choice, "auto",
                     "Force an all-reduce algorithm (rd, shm and hier are short forms); auto picks per call.");
  algo.accepted = {"auto", "ring", "recursive_doubling", "shared_memory", "hierarchical", "rd", "shm", "hier"};
  t.push_back(
      {algo,
       [algo](O& o, const std::string& v) { o.allreduce = parse_allreduce_algorithm(parse_choice_setting(algo, v)); },
       [](const O& o) { return std::string(to_string(o.allreduce)); }});
  t.push_back(number_field(row("TANDEM_SMALL_MESSAGE_BYTES", "small_message_bytes", K::bytes, "65536",
                               "All-reduces up to this size take recursive doubling instead of the ring.",
                               "set it to a byte count (0 disables the small-message path)"),
                           &O::small_message_bytes));
  t.push_back(bool_field(row("TANDEM_SHM", "shared_memory", K::boolean, "1",
                             "Ranks on one host map each other's memory and run collectives through it."),
                         &O::shared_memory));
  t.push_back(number_field(row("TANDEM_SHM_CHUNK_BYTES", "shm_chunk_bytes", K::bytes, "0",
                               "Pipeline chunk of the shared-memory collectives; 0: 256 KiB, 1 MiB when ranks "
                               "outnumber cores.",
                               "set it to the shared-memory pipeline chunk in bytes"),
                           &O::shm_chunk_bytes));
  t.push_back(number_field(row("TANDEM_SHM_SPLIT_MIN_RANKS", "shm_split_min_ranks", K::count, "2",
                               "From this many ranks the staged shared-memory all-reduce splits its chunks.",
                               "set it to a rank count (0 or 1: always split, a large value: never)"),
                           &O::shm_split_min_ranks));
  t.push_back(number_field(row("TANDEM_SHM_SPLIT_MIN_BYTES", "shm_split_min_bytes", K::bytes, "16384",
                               "Shared-memory all-reduces below this size stay unsplit.",
                               "set it to a byte count (0: split calls of every size)"),
                           &O::shm_split_min_bytes));
  t.push_back(number_field(row("TANDEM_SHM_CMA_MAX_BYTES", "shm_cma_max_bytes", K::bytes, "8388608",
                               "Largest buffer outside shared memory read by cross-memory attach instead of staged.",
                               "set it to a byte count (0: never use cross-memory attach)"),
                           &O::shm_cma_max_bytes));
  Setting cma = row("TANDEM_SHM_ALLREDUCE_CMA", "shm_allreduce_cma", K::choice, "timed",
                    "Shared-memory all-reduce and all-to-all of buffers outside shared memory: staged (never), by "
                    "cross-memory attach (always), by whichever rank 0 timed faster for that size (timed), or "
                    "(far) the all-reduce by cross-memory attach while a hand-off probe reads the ranks' cores far "
                    "apart and the all-to-all as timed.");
  cma.accepted = {"never", "far", "timed", "always"};
  t.push_back({cma,
               [cma](O& o, const std::string& v) {
                 o.shm_allreduce_cma = parse_shm_allreduce_cma(parse_choice_setting(cma, v));
               },
               [](const O& o) { return std::string(to_string(o.shm_allreduce_cma)); }});
  t.push_back(number_field(row("TANDEM_SHM_FAR_HANDOFF_NS", "shm_far_handoff_ns", K::nanoseconds, "180",
                               "One-way hand-off time from which two ranks' cores count as far apart.",
                               "set it to nanoseconds (one-way hand-off)"),
                           &O::shm_far_handoff_ns));
  return t;
}

}  // namespace

const SettingTable<RingOptions>& ring_settings() {
  static const SettingTable<RingOptions> table = make_table();
  return table;
}

RingOptions ring_options_from_env(const EnvLookup& env) {
  RingOptions o;
  read_settings(ring_settings(), env, o);
  return o;
}

}  // namespace tandem::ring
