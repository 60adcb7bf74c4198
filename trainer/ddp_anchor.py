#!/usr/bin/python3
"""PyTorch DDP (gloo) training the same experiment as `tandem train`: the anchor.

    /usr/bin/python3 trainer/ddp_anchor.py exp.yaml [--slots N] [--output DIR]
        [--max-batches N] [--per-slot-batch N] [--fp16-hook] [--separate-slices] [--compute-nice N] [--from-env]

It forks its ranks on this host; with --from-env it is one rank of a job
started by something else (bench/netns_run.sh, mpirun): rank and world size
from TANDEM_RANK/TANDEM_WORLD_SIZE, the rendezvous at TANDEM_STORE_ADDR's
host on the next port (set GLOO_SOCKET_IFNAME to the link's interface).

Same model (the dataset package's convnet or the MLP), same data (Fashion-MNIST
IDX files or the synthetic set's shape), same global batch split over the
slots, same SGD settings and seed, one compute thread per rank, validation over
the whole test set split across ranks. Same trajectory: the initial values
(seeded module construction in the same order), each epoch's order (tandem's
Fisher-Yates over std::mt19937_64, reproduced here) and each batch's dropout
seed are tandem's, so both systems train on the same records in the same
batches and their accuracies differ only by rounding (reduction order, fp16).
The optimizer (SGD with momentum, Nesterov and weight decay, Adam, AdamW)
and lr_schedule (warm-up, then constant, step or cosine) are tandem's,
through PyTorch's own optimizers, the rate set before each step by the same
formula as trainer/optimizer.cc. Writes the same JSON-lines metrics as tandem (kind start, train,
validation, end) to DIR/metrics.jsonl, so `tandem train --anchor` reads both.
--fp16-hook registers DDP's fp16_compress_hook (gradient_compression: fp16).
optimizations.tensor_fusion_threshold is DDP's bucket_cap_mb (default 25).
hyperparameters.layer_slices changes nothing by default: tandem computes the
same model, whole parameters, in row blocks, and hands the engine each block's
gradient as backward produces it. DDP reduces whole parameters only, so
--separate-slices rewrites each hidden layer into that many layers of their
own (the same function and initial values, other parameters): the way DDP
gets that overlap.

Debian's torch 1.13 runs only under /usr/bin/python3.
"""
import argparse
import datetime
import gzip
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import yaml


def load_idx(images, labels):
    with gzip.open(images, "rb") as f:
        img = np.frombuffer(f.read(), dtype=np.uint8, offset=16)
    with gzip.open(labels, "rb") as f:
        lab = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    return img.reshape(-1, 28, 28), lab


M64 = (1 << 64) - 1


def mt19937_64(seed, n):
    """The first n outputs of C++'s std::mt19937_64 seeded with seed (numpy has the 32-bit one only)."""
    mt = [seed & M64]
    for i in range(1, 312):
        mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & M64)
    mt = np.array(mt, dtype=np.uint64)
    upper, lower, a, one = np.uint64(0xFFFFFFFF80000000), np.uint64(0x7FFFFFFF), np.uint64(0xB5026F5AA96619E9), np.uint64(1)
    out = []
    for _ in range(-(-n // 312)):
        # The twist in three vector steps: words 0-155 read old words only, 156-310 the new 0-154, 311 the new 0.
        for lo, hi in ((0, 156), (156, 311)):
            x = (mt[lo:hi] & upper) | (mt[lo + 1:hi + 1] & lower)
            mt[lo:hi] = mt[(np.arange(lo, hi) + 156) % 312] ^ (x >> one) ^ np.where(x & one, a, np.uint64(0))
        x = (mt[311] & upper) | (mt[0] & lower)
        mt[311] = mt[155] ^ (x >> one) ^ (a if x & one else np.uint64(0))
        y = mt.copy()
        y ^= (y >> np.uint64(29)) & np.uint64(0x5555555555555555)
        y ^= (y << np.uint64(17)) & np.uint64(0x71D67FFFEDA60000)
        y ^= (y << np.uint64(37)) & np.uint64(0xFFF7EEE000000000)
        y ^= y >> np.uint64(43)
        out.append(y)
    return np.concatenate(out)[:n]


def epoch_order(records, seed, epoch):
    """tandem's BatchPlan::order (trainer/data.cc): Fisher-Yates, j = draw % (i + 1), i from the top."""
    draws = mt19937_64((seed * 0x9E3779B97F4A7C15 + epoch + 1) & M64, records - 1)
    js = (draws % np.arange(records, 1, -1, dtype=np.uint64)).tolist()
    order = list(range(records))
    for i, j in zip(range(records - 1, 0, -1), js):
        order[i], order[j] = order[j], order[i]
    return np.array(order, dtype=np.int64)


def steps_of(length, global_batch, steps_per_epoch):
    """A {batches|records|epochs: N} length in optimizer steps (trainer/optimizer.cc's length_in_steps)."""
    if not length:
        return 0
    (unit, value), = length.items()
    value = int(value)
    return {"batches": value, "records": -(-value // global_batch), "epochs": value * steps_per_epoch}[unit]


def learning_rate_at(hp, step, total_steps, global_batch, steps_per_epoch):
    """trainer/optimizer.cc's learning_rate_at: the rate of 1-based optimizer step `step`."""
    lr, s = hp.get("learning_rate", 0.01), hp.get("lr_schedule") or {}
    warmup = steps_of(s.get("warmup"), global_batch, steps_per_epoch)
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    after, kind = step - warmup, s.get("type", "constant")
    if kind == "step":
        size = max(1, steps_of(s.get("step_size"), global_batch, steps_per_epoch))
        return lr * math.pow(s.get("gamma", 0.1), (after - 1) // size)
    if kind == "cosine":
        span, low = total_steps - warmup, s.get("min_learning_rate", 0.0)
        if span <= 0:
            return low
        return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, after / span)))
    return lr


def make_optimizer(hp, params):
    name, wd = hp.get("optimizer", "sgd"), hp.get("weight_decay", 0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=hp.get("learning_rate", 0.01), momentum=hp.get("momentum", 0.9),
                               nesterov=hp.get("nesterov", False), weight_decay=wd)
    adam = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return adam(params, lr=hp.get("learning_rate", 0.01), betas=(hp.get("beta1", 0.9), hp.get("beta2", 0.999)),
                eps=hp.get("eps", 1e-8), weight_decay=wd)  # tandem's default 0 for AdamW too


def synthetic(size, seed, train):
    t = np.random.default_rng(seed).integers(0, 256, size=(10, 28, 28))
    rng = np.random.default_rng(seed * 2 + (0 if train else 1))
    labels = rng.integers(0, 10, size=size).astype(np.uint8)
    images = (t[labels] // 2 + rng.integers(0, 128, size=(size, 28, 28))).astype(np.uint8)
    return images, labels


def to_tensors(images, labels):
    x = torch.from_numpy(((images.astype(np.float32) / 255.0 - 0.2860) / 0.3530)[:, None, :, :].copy())
    return x, torch.from_numpy(labels.astype(np.int64))


class SlicedLinear(nn.Module):  # nn.Linear rewritten as row blocks, each block a parameter of its own
    def __init__(self, d_in, d_out, slices):
        super().__init__()
        whole = nn.Linear(d_in, d_out)
        bounds = [d_out * k // slices for k in range(slices + 1)]
        self.weights = nn.ParameterList([nn.Parameter(whole.weight[a:b].detach().clone()) for a, b in zip(bounds, bounds[1:])])
        self.biases = nn.ParameterList([nn.Parameter(whole.bias[a:b].detach().clone()) for a, b in zip(bounds, bounds[1:])])

    def forward(self, x):
        return torch.cat([F.linear(x, w, b) for w, b in zip(self.weights, self.biases)], 1)


def linear(d_in, d_out, slices):
    return nn.Linear(d_in, d_out) if slices == 1 else SlicedLinear(d_in, d_out, slices)


class ConvNet(nn.Module):  # benchmark/convnet.py of dataset-fashion-mnist
    def __init__(self, dropout, slices=1):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = linear(7 * 7 * 64, 1024, slices)
        self.fc2 = nn.Linear(1024, 10)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(self.drop(F.relu(self.fc1(x.flatten(1)))))


class Mlp(nn.Module):
    def __init__(self, hidden, dropout, slices=1):
        super().__init__()
        self.fc1, self.fc2 = linear(784, hidden, slices), linear(hidden, hidden, slices)
        self.fc3 = nn.Linear(hidden, 10)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = F.relu(self.fc2(F.relu(self.fc1(x.flatten(1)))))
        return self.fc3(self.drop(x))


def length_in_batches(length, global_batch, records_per_epoch):
    (unit, value), = length.items()
    if unit == "batches":
        return int(value)
    if unit == "records":
        return -(-int(value) // global_batch)
    return -(-int(value) * records_per_epoch // global_batch)


def worker(rank, world, args, addr, port):
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    cfg = yaml.safe_load(open(args.config))
    hp = cfg["hyperparameters"]
    seed = cfg.get("reproducibility", {}).get("experiment_seed", 0)
    per_slot = args.per_slot_batch or hp.get("global_batch_size", 64 * world) // world  # tandem's default: 64 a slot
    global_batch = per_slot * world
    data = cfg.get("data", "fashion-mnist")
    data = data.get("type", "fashion-mnist") if isinstance(data, dict) else data
    if data == "synthetic":
        train = synthetic(cfg.get("records_per_epoch", 60000), seed, True)
        test = synthetic(10000, seed, False)
    else:
        d = "/usr/share/datasets/fashion-mnist"
        train = load_idx(f"{d}/train-images-idx3-ubyte.gz", f"{d}/train-labels-idx1-ubyte.gz")
        test = load_idx(f"{d}/t10k-images-idx3-ubyte.gz", f"{d}/t10k-labels-idx1-ubyte.gz")
    records = min(cfg.get("records_per_epoch", len(train[1])), len(train[1]))
    xs, ys = to_tensors(*train)
    xt, yt = to_tensors(*test)
    total = args.max_batches or length_in_batches(cfg["searcher"]["max_length"], global_batch, records)
    period = cfg.get("min_validation_period")
    validate_every = length_in_batches(period, global_batch, records) if period else 0

    torch.manual_seed(seed)
    dropout = hp.get("dropout", 0.4)
    slices = hp.get("layer_slices", "auto") if args.separate_slices else 1
    if slices == "auto":
        sys.exit("ddp_anchor: --separate-slices needs hyperparameters.layer_slices as a number, not auto")
    model = Mlp(hp.get("mlp_hidden", 256), dropout, slices) if hp.get("model", "convnet") == "mlp" else ConvNet(dropout, slices)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    def to_layout(x):
        return x.contiguous(memory_format=torch.channels_last) if args.channels_last else x
    # DDP's bucket cap is what Determined's tensor_fusion_threshold sets for Horovod.
    cap_mb = cfg.get("optimizations", {}).get("tensor_fusion_threshold", 25)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    if args.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if args.compute_nice and world > 1:
        os.setpriority(os.PRIO_PROCESS, 0, args.compute_nice)  # this thread only; gloo's threads keep theirs
    opt = make_optimizer(hp, ddp.parameters())
    log = open(os.path.join(args.output, "metrics.jsonl"), "w") if rank == 0 else None

    def emit(**kw):
        if log:
            log.write(json.dumps(kw) + "\n")
            log.flush()

    emit(kind="start", batch=0, time=0.0, slots=world, global_batch=global_batch, per_slot_batch=per_slot,
         model=hp.get("model", "convnet"), data=data, total_batches=total, resumed_from=-1,
         anchor="pytorch-ddp-gloo" + ("+fp16-hook" if args.fp16_hook else "") + ("+channels-last" if args.channels_last else ""), compute_nice=args.compute_nice)

    def validate(batch):
        tv = time.perf_counter()
        ddp.eval()
        n = len(yt)
        lo, hi = n * rank // world, n * (rank + 1) // world
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for i in range(lo, hi, 500):
                logits = model(to_layout(xt[i:min(i + 500, hi)]))
                y = yt[i:min(i + 500, hi)]
                sums += torch.tensor([F.cross_entropy(logits, y, reduction="sum").item(),
                                      (logits.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
        dist.all_reduce(sums)
        ddp.train()
        # Stamped when the result is known, as tandem's.
        emit(kind="validation", batch=batch, time=time.perf_counter() - t0, loss=sums[0].item() / sums[2].item(),
             accuracy=sums[1].item() / sums[2].item(), records=int(sums[2].item()), seconds=time.perf_counter() - tv)

    per_epoch = records // global_batch
    # Every epoch's order before the clock starts (tandem draws its own in C++ in milliseconds).
    orders = {e: epoch_order(records, seed, e) for e in range((total - 1) // per_epoch + 1)}
    t0 = time.perf_counter()
    for batch in range(1, total + 1):
        ts = time.perf_counter()
        epoch = (batch - 1) // per_epoch
        start = ((batch - 1) % per_epoch) * global_batch + rank * per_slot
        idx = torch.from_numpy(orders[epoch][start:start + per_slot])
        x, y = xs[idx], ys[idx]
        data_s = time.perf_counter() - ts
        opt.zero_grad(set_to_none=False)
        torch.manual_seed((seed * 1000003 + batch * 131 + rank) & M64)  # dropout, as tandem's Trial::train_batch
        logits = ddp(to_layout(x))
        loss = F.cross_entropy(logits, y)
        loss.backward()  # DDP all-reduces buckets during backward and waits at its end
        for g in opt.param_groups:
            g["lr"] = learning_rate_at(hp, batch, total, global_batch, max(1, per_epoch))
        opt.step()
        m = torch.tensor([loss.item(), (logits.argmax(1) == y).float().mean().item()])
        dist.all_reduce(m)  # averaged training metrics, as tandem's average_training_metrics
        step = time.perf_counter() - ts
        emit(kind="train", batch=batch, epoch=epoch, time=time.perf_counter() - t0, loss=m[0].item() / world,
             accuracy=m[1].item() / world, samples_per_s=global_batch / step, step=step, data=data_s,
             compute=step - data_s, exposed=0.0, communication=0.0, communicated=True)
        if (validate_every and batch % validate_every == 0) or batch == total:
            validate(batch)
    emit(kind="end", batch=total, time=time.perf_counter() - t0)
    dist.barrier()
    if log:
        log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # an orderly exit of a forked rank can hang in gloo's threads


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--slots", type=int, default=0, help="ranks (default resources.slots_per_trial)")
    p.add_argument("--output", default="", help="directory for metrics.jsonl (default runs/<name>-ddp)")
    p.add_argument("--max-batches", type=int, default=0)
    p.add_argument("--per-slot-batch", type=int, default=0,
                   help="samples per rank per batch; the global batch is this times the ranks")
    p.add_argument("--fp16-hook", action="store_true", help="DDP's fp16_compress_hook on every bucket")
    p.add_argument("--channels-last", action="store_true",
                   help="the model and inputs channels-last, as tandem-train keeps the convnet's convolutions")
    p.add_argument("--separate-slices", action="store_true",
                   help="hyperparameters.layer_slices as separate layers (DDP reduces whole parameters only)")
    p.add_argument("--compute-nice", type=int, default=0, choices=range(20), metavar="N",
                   help="nice value of each rank's compute thread, as tandem-train's (default 0: unchanged)")
    p.add_argument("--from-env", action="store_true", help="be one rank: TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_STORE_ADDR")
    args = p.parse_args()
    cfg = yaml.safe_load(open(args.config))
    hp = cfg.get("hyperparameters", {})
    if hp.get("optimizer", "sgd") not in ("sgd", "adam", "adamw"):
        sys.exit(f"ddp anchor: {args.config}: hyperparameters.optimizer '{hp['optimizer']}' is none of sgd, adam, adamw")
    world = args.slots or cfg.get("resources", {}).get("slots_per_trial", 1)
    args.output = args.output or os.path.join("runs", cfg.get("name", "experiment") + "-ddp")
    os.makedirs(args.output, exist_ok=True)
    if args.from_env:
        host, port = os.environ["TANDEM_STORE_ADDR"].rsplit(":", 1)
        worker(int(os.environ["TANDEM_RANK"]), int(os.environ["TANDEM_WORLD_SIZE"]), args, host, int(port) + 1)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(world, args, "127.0.0.1", port), nprocs=world, start_method="fork")
    print(f"ddp anchor: {world} rank(s), metrics in {args.output}/metrics.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
