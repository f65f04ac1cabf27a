"""What an operator writes and what both servers co-sign from it.

The configuration schema of each daemon (``config``), how a problem with it is worded
(``config_errors``), the loader of files, flags and docs/CONFIG.md (``config_files``), and the
run's plan derived from it (``plan``: the model, sensitivity, noise multiplier, ring).

May import: garbled_core, spgc.common, spgc.wire, spgc.protocol, spgc.privacy, spgc.learning.
"""
