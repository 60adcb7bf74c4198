#!/usr/bin/env python3
"""Kills one slot of an elastic trial at a random batch, RUNS times, and
prints the seconds from each kill to the survivors' next committed step
(docs/training.md, "Elastic trials"). --kill picks the slot: one other than
the chief (the default), the chief (slot 0, whose duties pass to a
survivor), the two alternately (figures for each), or any. With --rejoin (a
config with max_restarts >= 1) the lost slot's replacement must join, and it
also prints the seconds from the replacement's start to its first committed
step. --stop stops the slot instead (SIGSTOP) and wakes it once the
others went on: it must find itself left out.

  python3 trainer/examples/elastic_kills.py build/bin/tandem-train trainer/examples/fashion_mnist_elastic.yaml \\
      --runs 10 --slots 4
  python3 trainer/examples/elastic_kills.py build/bin/tandem-train trainer/examples/fashion_mnist_rejoin.yaml \\
      --runs 20 --slots 4 --rejoin
  python3 trainer/examples/elastic_kills.py build/bin/tandem-train trainer/examples/fashion_mnist_elastic.yaml \\
      --runs 20 --slots 4 --kill alternate

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
import signal
import tempfile
import threading
import time


class NotStarted(Exception):
    """The trial failed before any slot was killed: nothing was measured."""


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
            self.wait_for_link()
        except BaseException:
            self.close()
            raise

    def wait_for_link(self):
        """A new veth pair carries traffic only once both ends are up: the first launch failed without this."""
        for _ in range(50):
            states = [subprocess.run(["ip", "-n", ns, "-o", "link", "show", f"veth{h}"], capture_output=True,
                                     text=True).stdout for h, ns in enumerate(self.names)]
            if all("state UP" in s for s in states):
                return
            time.sleep(0.1)
        raise SystemExit("the namespaces' veth pair did not come up within 5 s")

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


def wake_when_left_out(err_path, metrics_path, proc, woke):
    """--stop: once the survivors' membership line shows, SIGCONT the stopped slot (it must find itself left out)."""
    pid = None
    while proc.poll() is None:
        time.sleep(0.05)
        if pid is None:
            found = re.search(r"stopped at batch \d+ \(unix time [0-9.]+, pid (\d+)\)", open(err_path).read())
            pid = int(found.group(1)) if found else None
        elif os.path.exists(metrics_path) and '"kind":"membership"' in open(metrics_path).read():
            time.sleep(0.2)
            os.kill(pid, signal.SIGCONT)
            woke.append(time.time())
            return


def one_run(trainer, config, slots, batch, rank, out, rejoin, hosts, stop):
    command = [trainer, config]
    if hosts:
        command = hosts.command(trainer, hosts.config(config, slots, out))
    command += ["--slots", str(slots), "--output", out, "--quiet", "--fail-at-batch", str(batch), "--fail-rank",
                str(rank)] + (["--fail-stop"] if stop else [])
    err_path, woke = out + "/../stderr-" + os.path.basename(out), []
    with open(err_path, "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, text=True)
        waker = threading.Thread(target=wake_when_left_out, args=(err_path, out + "/metrics.jsonl", proc, woke))
        if stop:
            waker.start()
        proc.wait(timeout=600)
        if stop:
            waker.join()
    log = subprocess.CompletedProcess(command, proc.returncode, "", open(err_path).read())
    os.remove(err_path)
    killed = re.search(r"fault injection: rank \d+ (?:killed|stopped) at batch \d+ \(unix time ([0-9.]+)", log.stderr)
    # A stopped slot woken after it was left out must be refused (Excluded), not rejoin.
    fenced = bool(woke) and f"[{rank}]" in log.stderr and "left out" in log.stderr
    if not killed:
        errors = [l for l in log.stderr.splitlines() if "error:" in l]
        raise NotStarted(f"exit {log.returncode}: " + (errors[0] if errors else log.stderr[-500:]))
    if not os.path.exists(out + "/metrics.jsonl"):
        raise SystemExit(f"run (kill rank {rank} at batch {batch}) wrote no metrics:\n{log.stderr[-3000:]}")
    lines = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    origin = next(l["origin"] for l in lines if l["kind"] == "start")
    changes = [l for l in lines if l["kind"] == "membership"]
    joins = [l for l in changes if l.get("joined")]
    changes = [l for l in changes if not l.get("joined")]
    restarted = sum(1 for l in lines if l["kind"] == "start" and l.get("attempt", 0) > 0)
    epochs = {l["epoch"]: l for l in lines if l["kind"] == "epoch"}  # the slots stop on a short one
    short = [e for e in epochs.values() if e["records"] != e["expected"]]
    resumed = "resuming from" in log.stderr  # a checkpoint read
    took_over = rank != 0 or re.search(r"slot \d+ takes over as the chief", log.stderr)
    if (log.returncode != 0 or not killed or len(changes) != 1 or len(joins) != int(rejoin) or restarted or resumed
            or not epochs or short or not took_over or changes[0]["lost"] != [rank] or (woke and not fenced)):
        raise SystemExit(f"run (kill rank {rank} at batch {batch}) did not go on as expected:\n{log.stderr[-3000:]}")
    m = changes[0]
    committed = origin + m["time"] + m["recovery_seconds"]
    return (committed - float(killed.group(1)), m["recovery_seconds"], m["batches_redone"], joins[0] if joins else None,
            fenced)


def spread(values):
    q = statistics.quantiles(values, n=20, method="inclusive") if len(values) > 1 else values * 19
    return f"median {statistics.median(values):.3f} s, 95th percentile {q[18]:.3f} s, max {max(values):.3f} s"


def pick_rank(rng, kill, run, slots, hosts):
    if kill == "chief" or (kill == "alternate" and run % 2 == 0):
        return 0
    if hosts:  # a slot of the second namespace
        return rng.randint(slots // 2, slots - 1)
    return rng.randint(0 if kill == "any" else 1, slots - 1)


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
    p.add_argument("--stop", action="store_true",
                   help="SIGSTOP the slot instead (it falls silent; the heartbeat names it), then SIGCONT it once "
                   "the others went on: it must find itself left out")
    p.add_argument("--kill", choices=["others", "chief", "alternate", "any"], default="others",
                   help="the slot killed: one other than the chief (slot 0), the chief, the chief every other run "
                   "(first), or any slot")
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
    kill, seen, contributing = {"chief": [], "other": []}, {"chief": [], "other": []}, []
    not_started, fenced = 0, 0
    verb = "stopped" if a.stop else "killed"
    for i in range(a.runs):
        batch, rank = rng.randint(a.first, a.last), pick_rank(rng, a.kill, i, a.slots, hosts)
        for tries in range(1, 4):
            try:
                with tempfile.TemporaryDirectory() as out:
                    k, s, redone, join, refused = one_run(a.trainer, a.config, a.slots, batch, rank, out, a.rejoin,
                                                          hosts, a.stop)
                break
            except NotStarted as e:  # counted and said, then launched again
                not_started += 1
                print(f"run {i + 1}: the trial failed before the kill, launched again: {e}", flush=True)
        else:
            raise SystemExit(f"run {i + 1}: the trial failed before the kill {tries} times")
        who = "chief" if rank == 0 else "other"
        kill[who].append(k), seen[who].append(s)
        fenced += refused
        joined = ""
        if join:
            contributing.append(join["recovery_seconds"])
            joined = (f"; slot {join['joined'][0]} joined at batch {join['batch']}, contributing "
                      f"{join['recovery_seconds']:.3f} s after it started (state {join['state_bytes']} bytes in "
                      f"{join['state_seconds']:.3f} s)")
        woke = "; woken after, it found itself left out" if refused else ""
        print(f"run {i + 1}: rank {rank} {verb} at batch {batch}: {k:.3f} s from then to the next committed "
              f"step ({s:.3f} s from the failure seen), {redone} batch(es) redone{joined}{woke}", flush=True)
    for who, label in (("chief", "the chief (slot 0)"), ("other", "another slot")):
        if kill[who]:
            print(f"{label} {verb}, to the next committed step over {len(kill[who])} runs: {spread(kill[who])}; "
                  f"failure seen to committed: median {statistics.median(seen[who]):.3f} s")
    if not_started:
        print(f"{not_started} launch(es) failed before the kill and were made again")
    if contributing:
        print(f"replacement start to its first committed step: {spread(contributing)}")
    if a.stop:
        print(f"{fenced} of {a.runs} stopped slots were woken while the others ran and refused (left out)")


if __name__ == "__main__":
    main()
