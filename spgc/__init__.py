"""SPGC: two-server secure aggregation for differentially private collaborative learning.

The library is in subpackages by concern, each importing only those before it here
(docs/ARCHITECTURE.md; tests/test_layers.py enforces each one's "May import" line):

- ``spgc.common``: logs, progress, durable files, the CSPRNG, lanes;
- ``spgc.wire``: the gRPC protocol, its bounds, digests, TLS and transport;
- ``spgc.protocol``: modes, encoding, sharing, norm proofs, certificates;
- ``spgc.privacy``: accounting, noise, clipping, budgets, ledgers, feature statistics;
- ``spgc.learning``: models, data, gradients, losses, optimiser, local training, export;
- ``spgc.settings``: the daemons' configuration and the run's plan.

Above the library: ``spgc.servers`` and ``spgc.providers`` (the daemons), and ``spgc.app`` (the
``spgc`` command, the Python API ``spgc.app.api``, the demo and the benchmarks).

The modules that sat at the top level until 0.1.0 (``spgc.models``, ``spgc.noise``, ...) still
import, under their new name, with a DeprecationWarning: :data:`MOVED` lists them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

from spgc.common.logs import quiet_grpc_core

__version__ = "0.1.0"

# Before anything imports grpc (spgc.common.logs says why).
quiet_grpc_core()

#: Old top-level module -> its home since the library was split by concern (issue 49). The
#: aliases go in the release after 0.1.0.
MOVED: dict[str, str] = {
    f"spgc.{name}": f"spgc.{package}.{name}"
    for package, names in {
        "common": ("logs", "progress", "durable", "csprng", "lanes"),
        "protocol": ("encoding", "sharing", "norm_proof", "modes", "certs"),
        "privacy": (
            "accounting", "noise", "clipping", "budget", "ledger", "ledger_pair", "feature_stats",
        ),
        "learning": (
            "models", "data", "gradients", "losses", "optim", "trainable", "adapters",
            "local_training", "export",
        ),
        "settings": ("config", "config_errors", "config_files", "plan"),
    }.items()
    for name in names
}  # fmt: skip


class _MovedModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import spgc.models`` gives ``spgc.learning.models`` itself (one module object, so
    monkeypatching and isinstance see the same thing), after a DeprecationWarning."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        warnings.warn(
            f"{old} moved to {MOVED[old]}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns whatever sys.modules holds under the old name once this
        # returns: the moved module itself, not a copy.
        sys.modules[old] = importlib.import_module(MOVED[old])


if not any(isinstance(finder, _MovedModuleAlias) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleAlias())


def __getattr__(name: str) -> ModuleType:
    """``spgc.models`` as an attribute, for code that reached the old modules that way."""
    if f"spgc.{name}" in MOVED:
        return importlib.import_module(f"spgc.{name}")
    raise AttributeError(f"module 'spgc' has no attribute {name!r}")


__all__ = ["MOVED", "__version__"]
