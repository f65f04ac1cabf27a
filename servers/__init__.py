"""The SPGC server daemon (SPEC section 3, steps 6-10: the paper's Algorithm 2).

Installed as ``spgc.servers``; run it with ``spgc server --config server.yaml``. Its modules, from
the network inwards:

- :mod:`spgc.servers.daemon`: starts the gRPC services and the garbled-circuit link, resumes
  from a checkpoint, runs H1's, H2's or the single server's round loop;
- :mod:`spgc.servers.aggregator` (providers' RPCs) and :mod:`spgc.servers.intake` (share
  validation and sums); :mod:`spgc.servers.peer` (the other server's control RPCs);
- :mod:`spgc.servers.coordinator`: the phases of one round (agree, seeds, circuit or exchange,
  update, publish); :mod:`spgc.servers.pool_sync`: the noise pool between the two servers;
- :mod:`spgc.servers.gc_party`: one server's side of a batch over the garbled-circuit link;
  :mod:`spgc.servers.spgc_circuit`: the per-coordinate circuits (reconstruct plus noise,
  reconstruct only, and the paper's table sampler as a labelled non-DP baseline);
  :mod:`spgc.servers.noise_pool`: noise shares made ahead (mode preprocessed);
- :mod:`spgc.servers.state`, :mod:`spgc.servers.checkpoint`, :mod:`spgc.servers.evaluation`:
  the run's state, its checkpoints, the test-set evaluation.
"""
