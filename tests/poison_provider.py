"""A provider with valid credentials whose every vector is 1,000 times its clipped one, shared
and proved by our own prover without its checks (spgc.norm_proof.prove_unchecked): what a
dishonest provider running our code can send. Same command line as ``spgc provider``."""

from __future__ import annotations

import sys

import numpy as np

from spgc.norm_proof import prove_unchecked
from spgc.providers import training
from spgc.providers.__main__ import main

SCALE = 1000


def poisoned_vectors(self: training.Training, total: np.ndarray) -> list:
    params = self.norm_proof
    assert params is not None, "the poisoning provider expects verified inputs"
    leader, helper = prove_unchecked(np.asarray(total, dtype=np.int64) * SCALE + 1, params)
    values = np.concatenate([leader.inputs, leader.proof])
    empty = np.zeros(0, dtype=np.uint64)
    return [
        training.OutgoingShare(values, params.p, leader.blind, leader.helper_part),
        training.OutgoingShare(empty, params.p, b"", helper.leader_part, helper.seed),
    ]


if __name__ == "__main__":
    training.Training.make_vectors = poisoned_vectors  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
