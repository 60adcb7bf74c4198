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

With --hosts the slots span two "hosts": network namespaces joined by a veth
pair limited to RATE (tc tbf) in both directions, half the slots in each,
gradients over TCP (UCX_TLS=tcp,self), the trial placed by resources.hosts
through `ip netns exec` (--rsh) from the first namespace; the killed slot is
one in the second namespace, where its replacement starts. Needs root; the
namespaces are deleted when the runs end.

  sudo python3 trainer/examples/elastic_kills.py build/bin/tandem-train trainer/examples/fashion_mnist_rejoin.yaml \\
      --runs 10 --slots 4 --rejoin --hosts --rate 1gbit
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import tempfile


class TwoHosts:
    """Two network namespaces joined by one veth pair, 10.78.0.1 and .2/24."""

    def __init__(self, rate):
        self.names = [f"tek{os.getpid()}h{h}" for h in (0, 1)]
        self.address = "10.78.0.1"
        try:
            for ns in self.names:
                self.ip("netns", "add", ns)
                self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", self.names[0], "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns",
                    self.names[1])
            for h, ns in enumerate(self.names):
                self.ip("-n", ns, "addr", "add", f"10.78.0.{h + 1}/24", "dev", f"veth{h}")
                self.ip("-n", ns, "link", "set", f"veth{h}", "up")
                # burst >= one GSO packet (64 KiB), else tbf drops them; a short queue keeps the rate honest.
                subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", f"veth{h}", "root", "tbf", "rate", rate,
                                "burst", "128kb", "latency", "20ms"], check=True)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def ip(*args):
        subprocess.run(["ip", *args], check=True)

    def close(self):
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def config(self, config, slots, directory):
        """The experiment with half the slots on each namespace."""
        text = open(config).read()
        if "\nresources:\n" not in text:
            raise SystemExit(f"{config}: --hosts needs a block `resources:` to add the hosts to")
        text = text.replace("\nresources:\n", f"\nresources:\n  hosts: [{', '.join(self.names)}]\n"
                                              f"  slots_per_host: {slots // 2}\n", 1)
        path = os.path.join(directory, "experiment.yaml")
        open(path, "w").write(text)
        return path

    def command(self, trainer, config):
        return ["ip", "netns", "exec", self.names[0], "env", "UCX_TLS=tcp,self", trainer, config, "--rsh",
                "ip netns exec {host} sh -c", "--store-addr", self.address]


def one_run(trainer, config, slots, batch, rank, out, rejoin, hosts):
    command = [trainer, config]
    if hosts:
        command = hosts.command(trainer, hosts.config(config, slots, out))
    log = subprocess.run(command + ["--slots", str(slots), "--output", out, "--quiet",
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
    p.add_argument("--hosts", action="store_true", help="two network namespaces, the killed slot in the second")
    p.add_argument("--rate", default="1gbit", help="with --hosts: the link's rate (tc syntax)")
    a = p.parse_args()
    if a.hosts and (a.slots < 4 or a.slots % 2):
        raise SystemExit(f"--hosts splits the slots over two namespaces: give an even --slots of at least 4, "
                         f"not {a.slots}")
    hosts = TwoHosts(a.rate) if a.hosts else None
    try:
        measure(a, hosts)
    finally:
        if hosts:
            hosts.close()


def measure(a, hosts):
    rng = random.Random(a.seed)
    kill, seen, contributing = [], [], []
    for i in range(a.runs):
        batch, rank = rng.randint(a.first, a.last), rng.randint(a.slots // 2 if hosts else 1, a.slots - 1)
        with tempfile.TemporaryDirectory() as out:
            k, s, redone, join = one_run(a.trainer, a.config, a.slots, batch, rank, out, a.rejoin, hosts)
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
