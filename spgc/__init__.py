"""SPGC: two-server secure aggregation for differentially private collaborative learning."""

__version__ = "0.1.0"

__all__ = ["__version__"]
