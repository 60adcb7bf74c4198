#!/usr/bin/env python3
"""Saves the model of Determined's mnist_pytorch tutorial (0.38, model.py's Net) as TorchScript.

   /usr/bin/python3 trainer/examples/mnist_tutorial_model.py mnist_net.pt [--n-filters1 32 --n-filters2 64]

determined_tutorial_const.yaml and determined_tutorial_distributed.yaml name
the file (entrypoint: mnist_net.pt --epochs 1). tandem's loss is the cross
entropy of forward's output; Net ends in log_softmax, which cross entropy
leaves as it is, so the loss is train.py's nll_loss. dropout1 and dropout2 are
attributes the experiment's hyperparameters set when tandem loads the module,
and the str attribute optimizer names train.py's Adadelta, which tandem uses
while the hyperparameters name no optimizer (learning_rate 1.0 is Adadelta's;
train.py's StepLR, gamma 0.7 an epoch, first acts after the first epoch);
the filter counts shape the layers, so they are fixed here, and a run whose
hyperparameters disagree stops at its first forward saying so.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, n_filters1: int, n_filters2: int, dropout1: float, dropout2: float):
        super().__init__()
        self.conv1 = nn.Conv2d(1, n_filters1, 3, 1)
        self.conv2 = nn.Conv2d(n_filters1, n_filters2, 3, 1)
        self.fc1 = nn.Linear(144 * n_filters2, 128)
        self.fc2 = nn.Linear(128, 10)
        self.n_filters1: int = n_filters1
        self.n_filters2: int = n_filters2
        self.dropout1: float = dropout1
        self.dropout2: float = dropout2
        self.exported_filters = (n_filters1, n_filters2)
        # train.py's optimizer (optim.Adadelta), whose rate the YAML's learning_rate 1.0 is: tandem takes it
        # from here while the experiment's hyperparameters name none.
        self.optimizer: str = "adadelta"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (self.n_filters1, self.n_filters2) != self.exported_filters:
            raise RuntimeError("n_filters1 and n_filters2 shape the layers: export the model again with "
                               "mnist_tutorial_model.py --n-filters1 N --n-filters2 M")
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = F.dropout(x, self.dropout1, self.training)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, self.dropout2, self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output")
    p.add_argument("--n-filters1", type=int, default=32)
    p.add_argument("--n-filters2", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    net = Net(args.n_filters1, args.n_filters2, 0.25, 0.5)
    torch.jit.save(torch.jit.script(net), args.output)


if __name__ == "__main__":
    main()
