"""Training with tandem's gradient sync directly from PyTorch: no DDP, no process group.

    tandem launch -n 2 -- /usr/bin/python3 examples/gradient_sync_fashion_mnist.py

Every parameter's gradient is registered in model order; a hook on each
parameter copies its gradient into the sync's bucket and marks it ready, so
buckets are reduced while backward computes earlier layers; wait() before the
optimizer step, whose gradients are then views of the (averaged) buckets.
Training loss and accuracy are averaged over ranks exactly, riding on the
last bucket.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("TANDEM_PYTHONPATH", ""))
import tandem  # noqa: E402
from fashion_mnist import ConvNet, load  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    comm = tandem.init()
    rank, size = comm.rank, comm.size
    model = ConvNet()
    params = list(model.parameters())
    sync = tandem.GradientSync(comm, fusion_threshold=4 << 20, first_bucket=1 << 20, metric_slots=2)
    ids = [sync.register(f"param{i}", p.numel()) for i, p in enumerate(params)]
    sync.finalize(timeout=60)
    grads = [torch.from_numpy(sync.data(i)).view_as(p) for i, p in zip(ids, params)]  # views of the buckets

    def hook(i):
        def on_grad(grad):
            grads[i].copy_(grad)
            sync.mark_ready(ids[i])
            return grad
        return on_grad

    for i, p in enumerate(params):
        p.register_hook(hook(i))
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    images, labels = load("train")
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(args.seed))

    for step in range(args.steps):
        start = (step * args.batch * size) % (len(images) - args.batch * size)
        idx = order[start + rank * args.batch: start + (rank + 1) * args.batch]
        t0 = time.perf_counter()
        out = model(images[idx])
        loss = F.cross_entropy(out, labels[idx])
        correct = (out.argmax(1) == labels[idx]).sum().item()
        loss.backward()
        sync.report_metrics([(loss.item() * len(idx), len(idx)), (correct, len(idx))])
        sync.wait(timeout=60)
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        sync.zero()
        (loss_sum, n), (correct_sum, _) = sync.metrics()
        stats = sync.last_step()
        if rank == 0:
            print(json.dumps({"step": step, "loss": round(loss_sum / n, 5), "accuracy": round(correct_sum / n, 4),
                              "step_ms": round((time.perf_counter() - t0) * 1e3, 2),
                              "hidden": round(stats["hidden_fraction"], 3)}), flush=True)


if __name__ == "__main__":
    main()
