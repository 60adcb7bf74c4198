// `tandem train exp.yaml`: validates the experiment, starts its slots through
// the launch library (tandem/launch/launch.h, in this process), follows the
// chief's metrics file (progress line on a TTY), restarts a failed trial from
// its newest checkpoint up to max_restarts, then prints the summary and plots.
// `--scaling 1,2,4` runs the trial once per slot count and compares them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker_options.h"

namespace tandem::trainer {

struct DriverOptions {
  WorkerOptions worker;           // every slot gets these (as <trial dir>/worker-options.json)
  std::string output_dir;         // default runs/<name>
  std::vector<int> scaling;       // slot counts; empty = one trial
  std::string network_interface;  // flag; else TANDEM_/DTRAIN_NETWORK_INTERFACE; else the config's
  double target_accuracy = 0.85;
  bool quiet = false;  // no progress line, no summary
  // With resources.hosts: the launcher's rsh and store address (empty: its defaults).
  std::string rsh, store_address;
  // With elastic: the launcher's --host-discovery-script; slots it offers beyond those running join the trial,
  // up to elastic.max_slots.
  std::string host_discovery_script;
  std::string self;  // this executable
  // Also train each slot count with the PyTorch DDP (gloo) anchor script and compare.
  bool anchor = false;
  bool anchor_fp16 = false;   // with DDP's fp16_compress_hook
  std::string anchor_script;  // default: trainer/ddp_anchor.py of the source tree
  // Only tabulate finished runs: "LABEL=DIR" each (DIR holds metrics.jsonl).
  std::vector<std::string> compare;
};

int run_driver(DriverOptions options);

// "1,2,4" -> {1, 2, 4}; throws ConfigError naming the flag and the bad item.
std::vector<int> parse_slot_list(const std::string& text);

}  // namespace tandem::trainer
