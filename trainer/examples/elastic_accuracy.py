#!/usr/bin/env python3
"""Validation accuracy of an elastic trial through KILLS kill-and-rejoin
events against the same trial without failures, over several seeds
(docs/training.md, "Replacements"). Each failing run kills a random worker
that is not slot 0 (SIGKILL) every INTERVAL seconds once training runs; the
launcher starts a replacement (max_restarts is set to KILLS), which joins.

  python3 trainer/examples/elastic_accuracy.py build/bin/tandem-train --seeds 1,2,3 --kills 10
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time

CONFIG = """name: fashion-mnist-elastic-accuracy
hyperparameters:
  global_batch_size: 64
  learning_rate: 0.05
  momentum: 0.9
  dropout: 0.4
  model: convnet
resources:
  slots_per_trial: 4
elastic:
  min_slots: 3
searcher:
  name: single
  metric: validation_accuracy
  max_length:
    batches: {batches}
min_validation_period:
  batches: {batches}
records_per_epoch: 60000
max_restarts: {kills}
reproducibility:
  experiment_seed: {seed}
data: fashion-mnist
"""


def workers(driver_pid):
    """The running worker processes under the trial's driver: {pid: TANDEM_RANK}."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == driver_pid:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--worker-options" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"TANDEM_RANK" in env:
            found[int(pid)] = int(env[b"TANDEM_RANK"])
    return found


def one_run(trainer, seed, batches, kills, interval, out):
    config = os.path.join(out, "exp.yaml")
    with open(config, "w") as f:
        f.write(CONFIG.format(batches=batches, kills=max(kills, 1), seed=seed))
    # --slots: four slots share this host's cores when it has fewer.
    proc = subprocess.Popen([trainer, config, "--slots", "4", "--output", out, "--quiet"], stderr=subprocess.PIPE,
                            text=True)
    rng = random.Random(seed)
    done, settled = 0, set()
    time.sleep(interval * 2)  # data loading and the first steps
    while done < kills and proc.poll() is None:
        live = {p for p, r in workers(proc.pid).items() if r != 0}
        # Only workers seen a whole interval ago: a replacement is given time to join.
        if len(live) >= 3 and live & settled:
            os.kill(rng.choice(sorted(live & settled)), signal.SIGKILL)
            done += 1
        settled = live
        time.sleep(interval)
    _, err = proc.communicate(timeout=900)
    if not os.path.exists(out + "/metrics.jsonl"):
        raise SystemExit(f"seed {seed}: the trial wrote no metrics:\n{err[-3000:]}")
    lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    joins = sum(1 for l in lines if l["kind"] == "membership" and l.get("joined"))
    restarts = sum(1 for l in lines if l["kind"] == "start" and l.get("attempt", 0) > 0)
    accuracy = [l["accuracy"] for l in lines if l["kind"] == "validation"][-1]
    if proc.returncode != 0 or restarts:
        raise SystemExit(f"seed {seed}: the trial failed or restarted:\n{err[-3000:]}")
    return accuracy, done, joins


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trainer")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--batches", type=int, default=1500)
    p.add_argument("--interval", type=float, default=2.5, help="seconds between kills")
    a = p.parse_args()
    clean, failing = [], []
    for seed in [int(s) for s in a.seeds.split(",")]:
        for kills, into in ((0, clean), (a.kills, failing)):
            with tempfile.TemporaryDirectory() as out:
                accuracy, done, joins = one_run(a.trainer, seed, a.batches, kills, a.interval, out)
            into.append(accuracy)
            print(f"seed {seed}: {done} kills, {joins} joins, validation accuracy {accuracy:.4f}", flush=True)
    print(f"mean validation accuracy: without failures {statistics.mean(clean):.4f}, "
          f"with {a.kills} kill-and-rejoin events {statistics.mean(failing):.4f}, "
          f"difference {100 * (statistics.mean(failing) - statistics.mean(clean)):+.2f} points")


if __name__ == "__main__":
    main()
