#!/usr/bin/env python3
"""Saves a model of your own as TorchScript for `tandem train` (entrypoint: model.pt).

   /usr/bin/python3 trainer/examples/torchscript_model.py model.pt [--hidden 128]

tandem-train loads it with torch::jit::load and trains its parameters through
the same gradient sync as its built-in models: forward takes [N, 1, 28, 28]
float images and returns [N, 10] logits. Any scripted nn.Module with float32
parameters will do; this one is a small MLP.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, 10)
        # An attribute of a hyperparameter's name is set from the experiment's
        # hyperparameters when tandem loads the module (hyperparameters: {logit_scale: 2}).
        self.logit_scale: float = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1)))) * self.logit_scale


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.jit.save(torch.jit.script(Mlp(args.hidden)), args.output)


if __name__ == "__main__":
    main()
