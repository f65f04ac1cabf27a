"""A pretrained backbone's state loaded into a model that wraps it (issue 33: adapters).

Fine-tuning starts from a backbone trained elsewhere (on public data, say) and saved with
``safetensors.torch.save_file(model.state_dict(), ...)``. The model the servers train wraps it:
LoRA adapters from ``peft`` (``get_peft_model``), or adapters of the user's own, and perhaps a
new head. Its ``state_dict()`` names differ from the backbone's, so the servers'
``initial_model`` (:func:`spgc.learning.models.load_initial_state`) reads a state whose keys are not
exactly the model's as the backbone of the wrapped model, through :func:`backbone_name`:

- peft's wrapper prefix ``base_model.model.`` is dropped;
- a wrapped layer's ``base_layer`` (peft's LoRA layers; an adapter of your own that keeps the
  layer it wraps as ``self.base_layer`` works the same way) is dropped:
  ``backbone.1.base_layer.weight`` is the backbone's ``backbone.1.weight``;
- peft's ``modules_to_save`` copies (``head.modules_to_save.default.weight``, and the
  ``head.original_module.weight`` it was copied from) both take the backbone's ``head.weight``.

Every key of the backbone state must find a parameter or buffer of the model this way, with
the same shape. What is left of the model keeps the factory's values and must be trained
(``requires_grad``): the adapters (LoRA's B starts at zero, so the wrapped model computes the
backbone at first) and a new head. A frozen parameter left without a value would keep a random
initialisation for the whole run, so it is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from spgc.common.logs import listed

__all__ = ["backbone_name", "backbone_state"]

# Path segments a wrapper inserts around a layer of the backbone (peft's names).
_WRAPPER_PREFIX = ("base_model", "model")
_WRAPPED_LAYER = ("base_layer", "original_module")
_COPIES = "modules_to_save"  # followed by the adapter's name: a trained copy of a module


def backbone_name(key: str) -> str:
    """The name ``key`` of a wrapped model's state has in the backbone's own state."""
    parts = key.split(".")
    if tuple(parts[:2]) == _WRAPPER_PREFIX and len(parts) > 2:
        parts = parts[2:]
    out: list[str] = []
    i = 0
    while i < len(parts):
        if parts[i] in _WRAPPED_LAYER and i + 1 < len(parts):
            i += 1
        elif parts[i] == _COPIES and i + 2 < len(parts):
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return ".".join(out)


def backbone_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole state of ``model`` (its ``state_dict()`` keys) with ``state``, a backbone's
    state, at the places :func:`backbone_name` gives, and the model's own values elsewhere
    (adapters, a new head). ``ValueError`` in one line naming the backbone keys that find no
    place, the shapes that differ, or the frozen parameters that get no value."""
    own = model.state_dict()
    places: dict[str, list[str]] = {}
    for key in own:
        places.setdefault(backbone_name(key), []).append(key)
    homeless = [k for k in state if backbone_name(k) not in places]
    if homeless:
        raise ValueError(
            f"{len(homeless)} of its {len(state)} keys name no layer of the model "
            f"({listed(homeless)}), even read as a wrapped backbone (peft's base_model.model., "
            "base_layer, modules_to_save)"
        )
    whole = dict(own)
    filled: set[str] = set()
    shapes = []
    for key, value in state.items():
        for target in places[backbone_name(key)]:
            if tuple(own[target].shape) != tuple(value.shape):
                model_shape = tuple(own[target].shape)
                shapes.append(f"{key} {tuple(value.shape)} (model {target} {model_shape})")
            whole[target] = value
            filled.add(target)
    if shapes:
        raise ValueError(f"read as a wrapped backbone, wrong shapes {listed(shapes)}")
    unset = [
        name
        for name, p in model.named_parameters()
        if not p.requires_grad
        and name not in filled
        and "original_module" not in name.split(".")  # peft's unused copy of a trained module
    ]
    if unset:
        raise ValueError(
            f"read as a wrapped backbone, it gives no value to the frozen parameter(s) "
            f"{listed(unset)}, which would keep the factory's random values for the whole run"
        )
    return whole
