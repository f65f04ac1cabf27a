"""A model whose backbone is frozen (requires_grad=False): only its head travels.

`spgc demo --model examples/custom-model/frozen.py:frozen --json` against
`...:unfrozen` compares the bytes between the servers per round (docs/RESULTS.md). The
backbone here is randomly initialised; a real one would come from `initial_model`.
"""

from torch import nn


def backbone_head(freeze: bool) -> nn.Module:
    """Linear(30, 128), ReLU, Linear(128, 128), ReLU, then a Linear(128, 2) head: 20,480
    backbone parameters, 258 in the head (98.8% frozen when ``freeze``)."""
    model = nn.Sequential(
        nn.Linear(30, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
    )
    if freeze:
        for layer in (model[0], model[2]):
            layer.requires_grad_(False)
    return model


def frozen() -> nn.Module:
    return backbone_head(True)


def unfrozen() -> nn.Module:
    return backbone_head(False)
