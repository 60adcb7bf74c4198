#!/usr/bin/python3
"""Send/recv through torch.distributed on one tensor kept for every step, then on a new tensor every step.

Run under tandem launch, 2 ranks (TANDEM_HUGE_PAGES=0 and 1 in turn shows what huge pages cost fresh buffers):
    PYTHONPATH=build/python build/bin/tandem launch -n 2 -- /usr/bin/python3 bench/anchors/torch_fresh_buffers.py
Options through the environment: BYTES (default 16777216), STEPS (default 40; the first 5 are not counted).

A step is rank 0's send then recv of the tensor (rank 1 mirrors it), timed on rank 0. With fresh tensors,
every third one is kept alive, so that new tensors land at new addresses as a training step's would.
Prints the median and the mean per step, in milliseconds, for each way.
"""
import os
import statistics
import time

import torch
import torch.distributed as dist

import tandem.c10d  # noqa: F401  registers "tandem"

COUNT = int(os.environ.get("BYTES", "16777216")) // 4
STEPS = int(os.environ.get("STEPS", "40"))


def step(buf, rank):
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    else:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def main():
    dist.init_process_group("tandem")
    rank = dist.get_rank()
    for way in ("kept", "fresh"):
        buf, kept, times = torch.ones(COUNT), [], []
        for i in range(STEPS):
            if way == "fresh":
                buf = torch.ones(COUNT)
                if i % 3 == 0:
                    kept.append(buf)
            dist.barrier()
            t0 = time.perf_counter()
            step(buf, rank)
            times.append(time.perf_counter() - t0)
        if not bool((buf == 1.0).all()):
            raise SystemExit(f"rank {rank}: wrong result")
        counted = times[5:]
        if rank == 0:
            print(f"{way}: {COUNT * 4} B, median {statistics.median(counted) * 1e3:.2f} ms, "
                  f"mean {statistics.mean(counted) * 1e3:.2f} ms per step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
