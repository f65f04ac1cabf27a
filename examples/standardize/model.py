"""The linear regression the comparison trains: 8 clinical features in, one target out."""

from torch import nn


def linear() -> nn.Module:
    return nn.Linear(8, 1)
