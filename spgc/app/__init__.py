"""The application layer: the ``spgc`` command (:mod:`spgc.app.cli`), the localhost demo, the
benchmarks and the paper's experiments. The only code that imports both the servers and the
providers (docs/ARCHITECTURE.md)."""
