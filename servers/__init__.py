"""SPGC's server side. Among its modules:

- :mod:`servers.noise_sampler`: the discrete-Gaussian sampler circuit and the derivation of its
  parameters from the noise scale and the statistical-distance target;
- :mod:`servers.spgc_circuit`: the per-coordinate circuits (reconstruct plus noise, reconstruct
  only, and the paper's table sampler as a labelled non-DP baseline);
- :mod:`servers.gc_party`: one server's side of a batch over the garbled-circuit link.
"""
