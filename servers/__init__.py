"""The SPGC server daemon (SPEC section 3, steps 6-10: the paper's Algorithm 2).

Installed as ``spgc.servers``; run it with ``spgc server --config server.yaml``. Its modules, from
the network inwards:

- :mod:`spgc.servers.daemon`: starts the gRPC services and runs H1's, H2's or the single
  server's round loop, with its parts: :mod:`spgc.servers.pairing` (pairing with the other
  server, again after a loss), :mod:`spgc.servers.sessions` (what H1 and H2 each do while
  paired), :mod:`spgc.servers.data_link` (the garbled-circuit link),
  :mod:`spgc.servers.worker_pairing` (the circuit workers, ``workers`` > 1) and
  :mod:`spgc.servers.resume` (continuing from a checkpoint); :mod:`spgc.servers.errors`: the
  errors that stop a server or end its pairing;
- :mod:`spgc.servers.aggregator` (providers' RPCs) and :mod:`spgc.servers.intake` (share
  validation and sums); :mod:`spgc.servers.peer` (the other server's control RPCs);
- :mod:`spgc.servers.coordinator`: the phases of one round (agree, seeds, circuit or exchange,
  update, publish); :mod:`spgc.servers.pool_sync`: the noise pool between the two servers;
- :mod:`spgc.servers.gc_party`: one server's side of a batch over the garbled-circuit link;
  :mod:`spgc.servers.spgc_circuit`: the per-coordinate circuits (reconstruct plus noise,
  reconstruct only, and the paper's table sampler as a labelled non-DP baseline);
  :mod:`spgc.servers.noise_pool`: noise shares made ahead (mode preprocessed);
- :mod:`spgc.servers.state`: the run's state, with its parts :mod:`spgc.servers.round_phases`
  (a round's steps), :mod:`spgc.servers.ledger_state` (the privacy ledger and the accountant)
  and :mod:`spgc.servers.state_checkpoints` (its checkpoints and the exported model);
  :mod:`spgc.servers.checkpoint`, :mod:`spgc.servers.evaluation`: the checkpoint files, the
  test-set evaluation.
"""
