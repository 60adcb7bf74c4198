// The ring's settings table: one row per TANDEM_* variable that fills
// RingOptions, and the reader that applies it.
#include "tandem/errors.h"
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
                               "Pipeline chunk of the shared-memory collectives, a multiple of 4 KiB up to 64 MiB; 0: "
                               "256 KiB, 1 MiB when ranks outnumber cores.",
                               "set it to the shared-memory pipeline chunk in bytes, a multiple of 4096"),
                           &O::shm_chunk_bytes));
  t.push_back(number_field(row("TANDEM_SHM_SPLIT_MIN_RANKS", "shm_split_min_ranks", K::count, "2",
                               "From this many ranks the staged shared-memory all-reduce splits its chunks.",
                               "set it to a rank count (0 or 1: always split, a large value: never)"),
                           &O::shm_split_min_ranks));
  t.push_back(number_field(row("TANDEM_SHM_SPLIT_MIN_BYTES", "shm_split_min_bytes", K::bytes, "16384",
                               "Shared-memory all-reduces below this size stay unsplit.",
                               "set it to a byte count (0: split calls of every size)"),
                           &O::shm_split_min_bytes));
  Setting paths = row("TANDEM_SHM_PATHS", "shm_paths", K::text, "",
                      "Rows over the shared-memory path table, collective:buffers:bytes=path separated by commas, "
                      "later rows winning (docs/algorithms.md, 'The path table'); `tandem info` in a job prints the "
                      "table in effect.");
  t.push_back({paths,
               [paths](O& o, const std::string& v) {
                 try {
                   o.shm_paths = ShmPathTable(v);
                 } catch (const InvalidArgument& e) {
                   throw InvalidArgument("tandem: " + paths.variable + "='" + v + "' is invalid: " + e.what());
                 }
               },
               [](const O& o) { return o.shm_paths.overrides(); }});
  return t;
}

// Variables the path table replaced, each with the rows that do its work: a
// job still setting one would otherwise run another path unawares.
struct Retired {
  const char* variable;
  const char* instead;
};
constexpr Retired kRetired[] = {
    {"TANDEM_SHM_ALLREDUCE_CMA",
     "never: 'allreduce:heap:*=staged,alltoall:heap:*=staged'; always: "
     "'allreduce:heap:256K-16M=cma,alltoall:heap:64K-=cma'; timed is the default; far (the hand-off probe) is gone"},
    {"TANDEM_SHM_CMA_MAX_BYTES",
     "0: '*:heap:*=staged'; a maximum other than 8M, e.g. 4M: "
     "'reduce_scatter:heap:*=staged,reduce_scatter:heap:256K-4M=cma' (the allgather alike)"},
    {"TANDEM_SHM_FAR_HANDOFF_NS", "the hand-off probe it tuned is gone; the default table times the paths instead"},
};

void refuse_retired(const EnvLookup& env) {
  for (const Retired& r : kRetired) {
    if (env(r.variable)) {
      throw InvalidArgument(std::string("tandem: ") + r.variable +
                            " is retired; the shared-memory path table replaces it (TANDEM_SHM_PATHS, "
                            "docs/algorithms.md, 'The path table'): " +
                            r.instead);
    }
  }
}

}  // namespace

const SettingTable<RingOptions>& ring_settings() {
  static const SettingTable<RingOptions> table = make_table();
  return table;
}

RingOptions ring_options_from_env(const EnvLookup& env) {
  refuse_retired(env);
  RingOptions o;
  read_settings(ring_settings(), env, o);
  return o;
}

}  // namespace tandem::ring
