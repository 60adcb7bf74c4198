#!/usr/bin/env python3
"""Kills one slot of an elastic trial at a random batch, RUNS times, and
prints the seconds from each kill to the survivors' next committed step
(docs/training.md, "Elastic trials"). With --rejoin (a config with
max_restarts >= 1) the lost slot's replacement must join, and it also prints
the seconds from the replacement's start to its first committed step.

  python3 trainer/examples/elastic_kills.py build/bin/tandem-train trainer/examples/fashion_mnist_elastic.yaml \\
      --runs 10 --slots 4
  python3 trainer/examples/elastic_kills.py build/bin/tandem-train trainer/examples/fashion_mnist_rejoin.yaml \\
      --runs 20 --slots 4 --rejoin
"""
import argparse
import json
import random
import re
import statistics
import subprocess
import tempfile


def one_run(trainer, config, slots, batch, rank, out, rejoin):
    log = subprocess.run([trainer, config, "--slots", str(slots), "--output", out, "--quiet",
                          "--fail-at-batch", str(batch), "--fail-rank", str(rank)],
                         capture_output=True, text=True, timeout=600)
    killed = re.search(r"fault injection: rank \d+ killed at batch \d+ \(unix time ([0-9.]+)\)", log.stderr)
    lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    origin = next(l["origin"] for l in lines if l["kind"] == "start")
    changes = [l for l in lines if l["kind"] == "membership"]
    joins = [l for l in changes if l.get("joined")]
    changes = [l for l in changes if not l.get("joined")]
    restarted = sum(1 for l in lines if l["kind"] == "start" and l.get("attempt", 0) > 0)
    epochs = {l["epoch"]: l for l in lines if l["kind"] == "epoch"}  # the slots stop on a short one
    short = [e for e in epochs.values() if e["records"] != e["expected"]]
    resumed = "resuming from" in log.stderr  # a checkpoint read
    if (log.returncode != 0 or not killed or len(changes) != 1 or len(joins) != int(rejoin) or restarted or resumed
            or not epochs or short):
        raise SystemExit(f"run (kill rank {rank} at batch {batch}) did not go on as expected:\n{log.stderr[-3000:]}")
    m = changes[0]
    committed = origin + m["time"] + m["recovery_seconds"]
    return committed - float(killed.group(1)), m["recovery_seconds"], m["batches_redone"], joins[0] if joins else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trainer")
    p.add_argument("config")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--first", type=int, default=5, help="earliest batch to kill at")
    p.add_argument("--last", type=int, default=50, help="latest batch to kill at")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rejoin", action="store_true", help="the lost slot's replacement must join")
    a = p.parse_args()
    rng = random.Random(a.seed)
    kill, seen, contributing = [], [], []
    for i in range(a.runs):
        batch, rank = rng.randint(a.first, a.last), rng.randint(1, a.slots - 1)
        with tempfile.TemporaryDirectory() as out:
            k, s, redone, join = one_run(a.trainer, a.config, a.slots, batch, rank, out, a.rejoin)
        kill.append(k), seen.append(s)
        joined = ""
        if join:
            contributing.append(join["recovery_seconds"])
            joined = (f"; slot {join['joined'][0]} joined at batch {join['batch']}, contributing "
                      f"{join['recovery_seconds']:.3f} s after it started (state {join['state_bytes']} bytes in "
                      f"{join['state_seconds']:.3f} s)")
        print(f"run {i + 1}: rank {rank} killed at batch {batch}: {k:.3f} s from the kill to the next committed "
              f"step ({s:.3f} s from the failure seen), {redone} batch(es) redone{joined}", flush=True)
    q = statistics.quantiles(kill, n=20, method="inclusive") if len(kill) > 1 else kill * 19
    print(f"kill to next committed step over {len(kill)} runs: median {statistics.median(kill):.3f} s, "
          f"95th percentile {q[18]:.3f} s, max {max(kill):.3f} s; failure seen to committed: median "
          f"{statistics.median(seen):.3f} s")
    if contributing:
        q = statistics.quantiles(contributing, n=20, method="inclusive") if len(contributing) > 1 else contributing * 19
        print(f"replacement start to its first committed step: median {statistics.median(contributing):.3f} s, "
              f"95th percentile {q[18]:.3f} s, max {max(contributing):.3f} s")


if __name__ == "__main__":
    main()
