"""`spgc bench proof` at a small size: real proofs made and checked, the figures it prints
consistent with the parameters, an honest vector accepted and a poisoned one refused."""

from __future__ import annotations

import json

from helpers import run_in_process

from spgc.protocol.norm_proof import NormProofParams


def test_bench_proof_prints_consistent_figures() -> None:
    done = run_in_process(
        "bench", "proof", "--dim", "3000", "--bound", "5000", "--ring-bits", "20",
        "--repeat", "1", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    params = NormProofParams.for_plan(3000, 5000, 20)
    assert r["field_modulus"] == params.p and r["proof_elements"] == params.proof_len
    assert r["honest_accepted"] and r["poison_refused"]
    assert r["soundness_error"] <= 2.0**-40 and r["grinding_bits"] == 64
    assert r["quadratic_combinations"] == params.combinations
    assert max(r["soundness_terms_log2"].values()) <= -42
    assert "the squared norm or a bit check" in r["poison_refusal"]  # the adaptive forger
    assert r["upload_bytes_unverified"] == 2 * 3000 * 3  # two ring shares of 3 bytes a value
    values = params.n_inputs + params.proof_len
    assert r["upload_bytes_verified"] == values * params.element_bytes + 160
    assert r["upload_ratio"] == r["upload_bytes_verified"] / r["upload_bytes_unverified"]
    assert r["prove_seconds"] > 0 and r["leader_query_seconds"] > 0
    # the same messages with the dots made as the share arrived (the run checks they match)
    assert set(r["query_seconds_at_arrival"]) == set(r["query_seconds_at_agreement"]) == {
        "H1",
        "H2",
    }
    assert "at the agreement" in done.stderr
    assert "upload" in done.stderr and "refused: True" in done.stderr


def test_bench_proof_refuses_a_bound_no_field_can_hold() -> None:
    done = run_in_process("bench", "proof", "--dim", "10", "--bound", str(1 << 30))
    assert done.returncode == 2 and "too large for a verified field" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_in_process("bench", "proof", "--dim", "0")
    assert done.returncode == 2 and "must be >= 1" in done.stderr
