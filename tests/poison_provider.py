"""A provider with valid credentials who sends, in every round, the adaptive forger's shares
(spgc.app.cheating_provers, kind ``solve``: 1,000 times its clipped vector, appended values
solved for every weight it can know). Same command line as ``spgc provider``."""

from __future__ import annotations

import sys

import numpy as np

from spgc.app.cheating_provers import cheat
from spgc.protocol.norm_proof import proof_context
from spgc.providers import training
from spgc.providers.__main__ import main


def poisoned_vectors(self: training.Training, total: np.ndarray) -> list:
    params = self.norm_proof
    assert params is not None, "the poisoning provider expects verified inputs"
    context = proof_context(self.training.run_id, int(self.last_round), self.cfg.name)
    leader, helper = cheat("solve", np.asarray(total, dtype=np.int64), params, context)
    values = np.concatenate([leader.inputs, leader.proof])
    empty = np.zeros(0, dtype=np.uint64)
    return [
        training.OutgoingShare(values, params.p, leader.blind, leader.helper_part),
        training.OutgoingShare(empty, params.p, b"", helper.leader_parts, helper.seed),
    ]


if __name__ == "__main__":
    training.Training.make_vectors = poisoned_vectors  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
