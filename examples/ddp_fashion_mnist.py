"""PyTorch DistributedDataParallel on Fashion-MNIST, gradients through tandem or gloo.

    tandem launch -n 2 -- /usr/bin/python3 examples/ddp_fashion_mnist.py --allreduce backend
    tandem launch -n 2 -- /usr/bin/python3 examples/ddp_fashion_mnist.py --allreduce tandem
    tandem launch -n 2 -- /usr/bin/python3 examples/ddp_fashion_mnist.py --allreduce gloo

--allreduce backend: DDP unmodified on the process group of torch.distributed's
"tandem" backend (tandem.c10d); tandem: DDP over gloo with a communication hook
that sends every bucket through tandem; gloo: DDP over gloo. Under torchrun
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) the group comes from env://;
under tandem launch it is rendezvoused through tandem.

The model is the dataset package's convnet (conv32 5x5, pool, conv64 5x5, pool,
fc1024, fc10: 3.27 M parameters); one compute thread per rank; each rank reads
its own shard of every global batch. Prints one JSON line per step (rank 0) and
a summary; --dump writes the final parameters (.npy) for comparisons.
"""
import argparse
import importlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("TANDEM_PYTHONPATH", ""))
import tandem  # noqa: E402
import tandem.ddp  # noqa: E402
from fashion_mnist import ConvNet, load  # noqa: E402

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allreduce", choices=["backend", "tandem", "gloo"], default="backend")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--dump", help="write the final parameters of rank 0 here (.npy)")
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    backend = "tandem" if args.allreduce == "backend" else "gloo"
    if backend == "tandem":
        importlib.import_module("tandem.c10d")  # registers the backend
    comm = None
    if "TANDEM_RANK" not in os.environ:  # torchrun or the like: env://
        dist.init_process_group(backend)
    else:
        comm = tandem.init()
        tandem.ddp.init_process_group(comm, backend=backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    model = nn.parallel.DistributedDataParallel(ConvNet())
    if args.allreduce == "tandem":
        if comm is None:
            sys.exit("--allreduce tandem (the communication hook) runs under tandem launch")
        tandem.ddp.register(model, comm)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    images, labels = load("train")
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed))

    times = []
    for step in range(args.steps):
        start = (step * args.batch * size) % (len(images) - args.batch * size)
        idx = order[start + rank * args.batch: start + (rank + 1) * args.batch]
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(images[idx]), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
        if rank == 0:
            print(json.dumps({"step": step, "loss": round(loss.item(), 5), "step_ms": round(dt * 1e3, 2)}), flush=True)

    if rank == 0:
        test_images, test_labels = load("t10k")
        with torch.no_grad():
            acc = (model(test_images[:2000]).argmax(1) == test_labels[:2000]).float().mean().item()
        median = float(np.median(times)) if times else 0.0
        print(json.dumps({"summary": True, "allreduce": args.allreduce, "ranks": size, "batch_per_rank": args.batch,
                          "median_step_ms": round(median * 1e3, 2),
                          "samples_per_s": round(args.batch * size / median, 1) if median else 0,
                          "test_accuracy_2000": round(acc, 4)}), flush=True)
        if args.dump:
            np.save(args.dump, torch.cat([p.detach().flatten() for p in model.parameters()]).numpy())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
