"""Pretrain the backbone on the PUBLIC digits 0-4, without privacy (the data is public), and save
it for the servers' ``initial_model``: ``python pretrain.py [OUT]`` (default backbone.safetensors
beside this file). Deterministic: the same torch version gives the same file. Prints one line
with the public test accuracy.

The head is dropped: the private task (digits 5-9) gets a new one. The saved keys are the
classifier's own (``backbone.1.weight``, ...), as ``model.state_dict()`` names them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import Classifier, public_data

EPOCHS = 40
BATCH = 64


def pretrain() -> tuple[Classifier, float]:
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = (torch.from_numpy(a) for a in public_data())
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    for _ in range(EPOCHS):
        order = torch.randperm(len(x_train), generator=gen)
        for start in range(0, len(order), BATCH):
            idx = order[start : start + BATCH]
            opt.zero_grad()
            loss_fn(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    return model, accuracy


def main() -> None:
    default = Path(__file__).with_name("backbone.safetensors")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    torch.set_num_threads(1)
    model, accuracy = pretrain()
    state = model.state_dict()
    backbone = {k: v.contiguous() for k, v in state.items() if k.startswith("backbone.")}
    save_file(backbone, str(out))
    print(f"pretrained on the public digits 0-4: test accuracy {accuracy:.3f}; backbone in {out}")


if __name__ == "__main__":
    main()
