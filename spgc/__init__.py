"""SPGC: two-server secure aggregation for differentially private collaborative learning."""

from spgc.logs import quiet_grpc_core

__version__ = "0.1.0"

# Before anything imports grpc (spgc.logs says why).
quiet_grpc_core()

__all__ = ["__version__"]
