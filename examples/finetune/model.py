"""Fine-tuning with adapters: a backbone pretrained on public data, LoRA adapters and a new head
trained with differential privacy on the providers' private data.

Data: scikit-learn's 8x8 handwritten digits (shipped with it, no download). The PUBLIC part is
the digits 0-4 (:func:`public_data`, for :mod:`pretrain`); the PRIVATE part is the digits 5-9
(:func:`private_data`, labels 0-4 standing for 5-9), which the three providers share out and
the servers test on.

Models, all the same :class:`Classifier` (a two-layer MLP backbone and a linear head):

- :func:`factory`: a LoRA adapter (rank 8) of our own on the backbone's first layer, the
  backbone frozen, a new head trained: only the adapter and the head travel.
- :func:`full`: every parameter trained (full fine-tuning), for the comparison.
- :func:`sparse_lowrank`: low-rank factors and a sparse part on the backbone's first layer,
  ``W0 + B A + S`` (paper 001's low rank and sparsity; :class:`LowRankSparseLinear`): LoRA of
  rank 4, and S trained only at the 5% of elements where the pretrained |W0| is largest
  (:func:`spgc.learning.trainable.set_trainable_mask`); only those elements of S travel.
- :func:`peft_factory`: the same adapters made by ``peft`` (``pip install 'spgc[peft]'``).

The servers' ``initial_model: backbone.safetensors`` is the pretrained classifier's state
without its head (``backbone.1.weight``, ...). It loads into the wrapped model because the
adapters keep the layer they wrap as ``base_layer``, as peft does (:mod:`spgc.learning.adapters`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from spgc.learning.trainable import set_trainable_mask

HIDDEN = 128
CLASSES = 5  # each half of the digits
RANK = 8
ALPHA = 8.0  # scaling alpha / rank = 1
# The adapted layers: the backbone's first Linear (64 pixels -> 128) only. The features of
# digits 0-4 need their first layer moved most for 5-9; every adapted coordinate also takes
# noise. In a DP-SGD simulation of this run (the same data, noise multiplier, rounds and
# Adam, 3 to 6 seeds each), mean test accuracy: rank 2 on both layers 0.90, rank 4 on the
# last layer 0.81, rank 4 on the first layer and 2 on the last 0.95, rank 8 on the first
# layer 0.96 (full fine-tuning: 0.96; the head alone: 0.67).
ADAPTED = ("backbone.1",)


class Classifier(nn.Module):
    """(n, 1, 8, 8) images -> (n, 5) logits: Linear(64, 128), ReLU, Linear(128, 128), ReLU as
    the backbone, Linear(128, 5) as the head; 25,477 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Flatten(), nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU()
        )
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class LoRALinear(nn.Module):
    """``base_layer(x) + B A dropout(x) * alpha / rank`` (Hu et al. 2021): the wrapped layer
    is frozen; A (rank x in) starts small and random, B (out x rank) at zero, so the wrapped
    model computes the backbone's function until B moves."""

    def __init__(
        self, base_layer: nn.Linear, rank: int = RANK, alpha: float = ALPHA, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base_layer.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base_layer.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.dropout(x) @ self.lora_A.T @ self.lora_B.T
        return self.base_layer(x) + update * self.scaling


def with_adapters(
    model: Classifier,
    rank: int = RANK,
    dropout: float = 0.0,
    adapted: tuple[str, ...] = ADAPTED,
) -> Classifier:
    """``model`` with the backbone Linears named in ``adapted`` (``backbone.3``, ...) wrapped
    in a :class:`LoRALinear`, the rest of the backbone frozen; the head stays trainable."""
    model.backbone.requires_grad_(False)
    for i, layer in enumerate(model.backbone):
        if f"backbone.{i}" in adapted and isinstance(layer, nn.Linear):
            model.backbone[i] = LoRALinear(layer, rank=rank, dropout=dropout)
    return model


def factory() -> nn.Module:
    """The adapter's model: 2,181 trained parameters (1,536 in the adapter, 645 in the head)
    of 27,013; the backbone's 24,832 are frozen."""
    return with_adapters(Classifier())


def full() -> nn.Module:
    """Full fine-tuning: all 25,477 parameters trained."""
    return Classifier()


# sparse_lowrank: the rank of its factors and the share of W0's elements S trains. Chosen
# before the runs in the README, in the same DP-SGD simulation as ADAPTED (3 to 5 seeds each,
# mean test accuracy; rank 8 dense, this folder's factory: 0.952 over 3): rank 4 with S at the
# 5% largest |W0| 0.952 (1,823 coordinates), rank 2 with the same S 0.907 (1,439), rank 4
# alone 0.947 (1,413), and paper 001's own masks (rank 8, A and B trained only at the half of
# the input and output units whose pretrained weights are largest) 0.935 over 3 (1,413).
SPARSE_RANK = 4
SPARSE_DENSITY = 0.05
BACKBONE_FILE = Path(__file__).with_name("backbone.safetensors")


class LowRankSparseLinear(LoRALinear):
    """``base_layer(x) + B A x * alpha / rank + S x``: a LoRA adapter and a sparse part S
    (out x in, starting at zero) whose trainable elements a mask picks
    (:func:`spgc.learning.trainable.set_trainable_mask`); the other elements of S stay zero."""

    def __init__(self, base_layer: nn.Linear, rank: int = SPARSE_RANK) -> None:
        super().__init__(base_layer, rank=rank)
        self.sparse = nn.Parameter(torch.zeros_like(base_layer.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + x @ self.sparse.T


def largest_magnitudes(weight: torch.Tensor, density: float) -> torch.Tensor:
    """Bool mask of ``weight``'s shape, True at its ``density`` share of largest |values| (ties
    broken by position, so every party picks the same elements)."""
    keep = round(density * weight.numel())
    order = torch.argsort(weight.abs().reshape(-1), descending=True, stable=True)
    mask = torch.zeros(weight.numel(), dtype=torch.bool)
    mask[order[:keep]] = True
    return mask.reshape(weight.shape)


def sparse_lowrank() -> nn.Module:
    """The backbone's first layer as ``W0 + B A + S`` (:class:`LowRankSparseLinear`, rank 4),
    S trained only where the pretrained |W0| is among the largest 5% (paper 001: the
    pretrained weights pick the elements, on public data, at no privacy cost), and a new head:
    1,823 trained parameters (768 in A and B, 410 of S's 8,192, 645 in the head) of 34,437.
    Reads the pretrained W0 from backbone.safetensors beside this file (``python
    pretrain.py`` writes it): every server and provider must hold the same file, or their
    masks, and so the model fingerprints, differ."""
    if not BACKBONE_FILE.is_file():
        raise FileNotFoundError(f"{BACKBONE_FILE} is missing: run pretrain.py first")
    pretrained = load_file(str(BACKBONE_FILE))["backbone.1.weight"]
    model = Classifier()
    model.backbone.requires_grad_(False)
    layer = LowRankSparseLinear(model.backbone[1])
    model.backbone[1] = layer
    set_trainable_mask(layer, "sparse", largest_magnitudes(pretrained, SPARSE_DENSITY))
    return model


def peft_factory() -> nn.Module:
    """The same rank-8 adapter from peft (``spgc[peft]``), its LoRA on the backbone's first
    layer and the head trained; peft names the layer base_model.model.backbone.1.base_layer"""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=list(ADAPTED), lora_dropout=0.0
    )
    model = get_peft_model(Classifier(), config)
    model.base_model.model.head.requires_grad_(True)
    return model


def _digits(low: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits low..low+4, labels 0..4, pixels in [0, 1] as (n, 1, 8, 8) float32, a fixed
    stratified 80/20 split."""
    digits = load_digits()
    keep = (digits.target >= low) & (digits.target < low + CLASSES)
    x = (digits.images[keep] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = (digits.target[keep] - low).astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=0
    )
    return x_train, y_train, x_test, y_test


def public_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The public half, digits 0-4 (901 images): what the backbone is pretrained on."""
    return _digits(0)


def private_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The private half, digits 5-9 as labels 0-4 (896 images): 716 for training, shared out
    among the providers, and 180 for the servers' test."""
    return _digits(CLASSES)
