"""Verified inputs (issue 35): the plan's norm proofs, the wire, the intake of field shares, the
servers' joint check, and a round in which a provider with valid credentials sends a vector
over the bound through our own prover: it is left out, told why and audited, every round,
and the round goes on with the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import TESTS_ROOT

from spgc.app.bench_load import LoadOptions, verified
from spgc.app.demo import DemoOptions, verifies_inputs, write_configs
from spgc.protocol import norm_proof
from spgc.protocol.norm_proof import (
    DEFAULT_REPETITIONS,
    NormProofParams,
    proof_context,
    prove,
    prove_unchecked,
)
from spgc.providers.errors import ProviderRefusal
from spgc.providers.plan_checks import check_plan, norm_proof_params
from spgc.servers.errors import PeerMismatchError
from spgc.servers.intake import INVALID_ARGUMENT, FieldShares, ShareIntake, SubmissionRejected
from spgc.servers.metrics import ServerMetrics
from spgc.servers.norm_checks import (
    PreparedDots,
    norm_refusals,
    round_coin,
    verifier_messages,
)
from spgc.settings.config import ServerConfig
from spgc.settings.config_files import load_server_config
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.errors import InvalidArgumentError
from spgc.wire.messages import iter_share_payload, read_share_header, share_messages

PARAMS = NormProofParams.for_plan(dim=40, bound=5000, ring_bits=20, repetitions=32)
RUN = "run-v"


def _ctx(name: str, t: int = 0) -> bytes:
    return proof_context(RUN, t, name)


def _vector(norm: float, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed).normal(size=PARAMS.dim)
    return np.trunc(g / np.linalg.norm(g) * norm).astype(np.int64)


def _receive(intake: ShareIntake, name: str, values: np.ndarray, fields: tuple) -> None:
    raw = values.astype("<u8").tobytes()
    chunks = [raw[i : i + 800] for i in range(0, len(raw), 800)]
    intake.receive(name, 0, os.urandom(16), len(values), 20, chunks, proof_fields=fields)


def _two_intakes(shares: dict[str, tuple]) -> tuple[ShareIntake, ShareIntake]:
    h1 = ShareIntake(PARAMS.dim, 20, field_shares=FieldShares(PARAMS, leader=True))
    h2 = ShareIntake(PARAMS.dim, 20, field_shares=FieldShares(PARAMS, leader=False))
    for intake in (h1, h2):
        intake.open_round(0)
    for name, (leader, helper) in shares.items():
        values = np.concatenate([leader.inputs, leader.proof])
        _receive(h1, name, values, (leader.blind, leader.helper_part, b""))
        _receive(h2, name, np.zeros(0, np.uint64), (b"", helper.leader_parts, helper.seed))
    return h1, h2


def test_the_servers_sum_field_shares_and_refuse_a_poisoned_one_alike() -> None:
    honest = {f"p{i}": _vector(4000, i) for i in range(3)}
    shares = {name: prove(x, PARAMS, _ctx(name)) for name, x in honest.items()}
    shares["bad"] = prove_unchecked(_vector(50_000, 9), PARAMS, _ctx("bad"))
    shares["late"] = prove(_vector(4000, 5), PARAMS, _ctx("late", 1))  # made for round 1
    h1, h2 = _two_intakes(shares)
    names = sorted(shares)
    for intake in (h1, h2):
        assert intake.close_round() == frozenset(names)
    coin = round_coin(RUN, 0, os.urandom(32))
    m1 = verifier_messages(h1, PARAMS, coin, RUN, 0, names)
    m2 = verifier_messages(h2, PARAMS, coin, RUN, 0, names)
    refused = norm_refusals(PARAMS, names, m1, names, m2, True)
    assert set(refused) == {"bad", "late"}
    assert "another provider, round or run" in refused["late"]
    # the same at both servers
    assert norm_refusals(PARAMS, names, m2, names, m1, False) == refused
    keep = [n for n in names if n not in refused]
    for intake in (h1, h2):
        assert intake.restrict_to(keep) == frozenset({"bad", "late"})
    p = PARAMS.p
    total = (h1.total().astype(object) + h2.total().astype(object)) % p
    want = sum(honest.values())
    assert [int(v) - p if v > p // 2 else int(v) for v in total] == want.tolist()
    h1.close()
    h2.close()


def test_dots_prepared_as_shares_arrive_give_the_same_messages(monkeypatch) -> None:
    """The wraparound dots each server computes as a share arrives (PreparedDots) give the
    verifier messages computed at the agreement without them, for honest and poisoned shares;
    dots prepared for a share the provider then replaced are never used for the new one."""
    shares = {f"p{i}": prove(_vector(4000, i), PARAMS, _ctx(f"p{i}")) for i in range(3)}
    shares["bad"] = prove_unchecked(_vector(50_000, 9), PARAMS, _ctx("bad"))
    h1, h2 = _two_intakes(shares)
    names = sorted(shares)
    preps = (PreparedDots(), PreparedDots())
    for intake, prep in zip((h1, h2), preps, strict=True):
        for name in names:
            prep.prepare(intake, PARAMS, RUN, 0, name)
        assert len(prep) == len(names)
        intake.close_round()
    coin = round_coin(RUN, 0, os.urandom(32))
    computed: list[int] = []
    real = norm_proof._share_dots

    def counted(*args):
        computed.append(1)
        return real(*args)

    for intake, prep in zip((h1, h2), preps, strict=True):
        plain = verifier_messages(intake, PARAMS, coin, RUN, 0, names)
        computed.clear()
        monkeypatch.setattr(norm_proof, "_share_dots", counted)
        assert verifier_messages(intake, PARAMS, coin, RUN, 0, names, prep) == plain
        assert computed == []  # every share's dots came from the arrival
        monkeypatch.undo()
    # Another share of p0 (its x share, so J1, differs): the prepared dots are not its own.
    other = prove(_vector(4000, 77), PARAMS, _ctx("p0"))
    h1b, _ = _two_intakes({"p0": other})
    h1b.close_round()
    fresh = verifier_messages(h1b, PARAMS, coin, RUN, 0, ["p0"])
    assert verifier_messages(h1b, PARAMS, coin, RUN, 0, ["p0"], preps[0]) == fresh
    for intake in (h1, h2, h1b):
        intake.close()


def test_malformed_verifier_messages_from_the_peer_are_a_mismatch_not_a_refusal() -> None:
    shares = {"p0": prove(_vector(100, 1), PARAMS, _ctx("p0"))}
    h1, h2 = _two_intakes(shares)
    for intake in (h1, h2):
        intake.close_round()
    coin = round_coin(RUN, 0, b"a" * 32)
    m1 = verifier_messages(h1, PARAMS, coin, RUN, 0, ["p0"])
    with pytest.raises(PeerMismatchError, match="bytes; expected"):
        norm_refusals(PARAMS, ["p0"], m1, ["p0"], [m1[0][:-1]], True)
    with pytest.raises(PeerMismatchError, match="messages for"):
        norm_refusals(PARAMS, ["p0"], m1, ["p0"], [], True)
    with pytest.raises(PeerMismatchError, match="not 32"):
        round_coin(RUN, 0, b"")
    h1.close()
    h2.close()


def test_the_coin_is_h1s_fresh_part_bound_to_the_run_and_the_round() -> None:
    part = os.urandom(32)
    coins = {
        round_coin(RUN, 3, part),
        round_coin(RUN, 4, part),
        round_coin("other", 3, part),
        round_coin(RUN, 3, os.urandom(32)),
    }
    assert len(coins) == 4 and all(len(c) == 32 for c in coins)
    with pytest.raises(PeerMismatchError, match="33 bytes, not 32"):
        round_coin(RUN, 3, part + b"x")


@pytest.mark.parametrize("second_vector", ["the same vector", "a vector over the bound"])
def test_a_provider_that_gives_h2_another_sharing_once_the_coin_is_drawn_is_refused(
    second_vector: str,
) -> None:
    # H1 draws the coin once its intake closed, holding the hash of the seed this provider
    # sent H2 (the helper part, with H1's share): every value the coin constrains is fixed
    # then. A provider that learnt the coin and re-shares for H2 (a new seed, the same vector
    # or another one proved without the bound) is refused for that; its honest control passes.
    x = _vector(4000, 3)
    to_h1, _ = prove(x, PARAMS, _ctx("cheat"))
    coin = round_coin(RUN, 0, os.urandom(32))
    if second_vector == "the same vector":
        _, to_h2 = prove(x, PARAMS, _ctx("cheat"))
    else:
        _, to_h2 = prove_unchecked(_vector(50_000, 4), PARAMS, _ctx("cheat"))
    shares = {"cheat": (to_h1, to_h2), "honest": prove(_vector(4000, 5), PARAMS, _ctx("honest"))}
    h1, h2 = _two_intakes(shares)
    names = sorted(shares)
    for intake in (h1, h2):
        intake.close_round()
    m1 = verifier_messages(h1, PARAMS, coin, RUN, 0, names)
    m2 = verifier_messages(h2, PARAMS, coin, RUN, 0, names)
    refused = norm_refusals(PARAMS, names, m1, names, m2, True)
    assert list(refused) == ["cheat"]
    # its parts at the two servers differ ("replayed" when none of them match)
    assert "joint randomness part" in refused["cheat"]
    h1.close()
    h2.close()


def test_the_intake_refuses_missing_or_misplaced_proof_fields_and_values_off_the_field() -> None:
    leader, helper = prove(_vector(100, 2), PARAMS, _ctx("p0"))
    values = np.concatenate([leader.inputs, leader.proof])
    h1 = ShareIntake(PARAMS.dim, 20, field_shares=FieldShares(PARAMS, leader=True))
    h1.open_round(0)
    for fields, message in [
        ((b"", leader.helper_part, b""), "norm_blind to H1 must be 32 bytes"),
        ((leader.blind, leader.helper_part, helper.seed), "norm_seed to H1 must be empty"),
        ((leader.blind, helper.leader_parts, b""), "norm_joint_part to H1 must be 32 bytes"),
    ]:
        with pytest.raises(SubmissionRejected, match=message) as err:
            _receive(h1, "p0", values, fields)
        assert err.value.code == INVALID_ARGUMENT
    off = values.copy()
    off[3] = PARAMS.p
    with pytest.raises(SubmissionRejected, match="outside the field"):
        _receive(h1, "p0", off, (leader.blind, leader.helper_part, b""))
    with pytest.raises(SubmissionRejected, match="this run's shares have"):
        _receive(h1, "p0", values[:-1], (leader.blind, leader.helper_part, b""))
    plain = ShareIntake(PARAMS.dim, 20)
    plain.open_round(0)
    with pytest.raises(SubmissionRejected, match="without verified inputs"):
        _receive(plain, "p0", np.zeros(PARAMS.dim, np.uint64), (leader.blind, b"", b""))
    h2 = ShareIntake(PARAMS.dim, 20, field_shares=FieldShares(PARAMS, leader=False))
    h2.open_round(0)
    empty = np.zeros(0, np.uint64)
    with pytest.raises(SubmissionRejected, match="norm_joint_part to H2 must be 64 bytes"):
        _receive(h2, "p0", empty, (b"", leader.helper_part, helper.seed))  # one part of two
    for intake in (h1, h2, plain):
        intake.close()


def test_the_wire_carries_a_field_share_to_h1_and_a_bare_seed_to_h2() -> None:
    leader, helper = prove(_vector(100, 3), PARAMS, _ctx("p0"))
    values = np.concatenate([leader.inputs, leader.proof])
    common = {"run_id": "r", "round_number": 0, "ring_bits": 20, "submission_id": b"s" * 16}
    to_h1 = list(
        share_messages(
            values, server_role=pb.SERVER_ROLE_H1, encoding=pb.SHARE_ENCODING_FIELD,
            field_modulus=PARAMS.p, norm_blind=leader.blind,
            norm_joint_part=leader.helper_part, **common,
        )
    )  # fmt: skip
    header = read_share_header(iter(to_h1), num_elements=len(values), field_modulus=PARAMS.p)
    data = b"".join(iter_share_payload(iter(to_h1[1:]), header, field_modulus=PARAMS.p))
    assert np.array_equal(np.frombuffer(data, "<u8"), values)
    assert len(to_h1[1].chunk.data) == len(values) * PARAMS.element_bytes  # packed: 7 bytes
    to_h2 = list(
        share_messages(
            np.zeros(0, np.uint64), server_role=pb.SERVER_ROLE_H2,
            encoding=pb.SHARE_ENCODING_FIELD, field_modulus=PARAMS.p,
            norm_joint_part=helper.leader_parts, norm_seed=helper.seed, **common,
        )
    )  # fmt: skip
    assert len(to_h2) == 1 and to_h2[0].header.num_elements == 0
    read_share_header(iter(to_h2), num_elements=0, field_modulus=PARAMS.p)
    bare = pb.ShareChunk()
    bare.CopyFrom(to_h2[0])
    bare.header.norm_seed = b""
    with pytest.raises(InvalidArgumentError, match="empty share without a norm_seed"):
        read_share_header(iter([bare]), num_elements=0, field_modulus=PARAMS.p)
    with pytest.raises(InvalidArgumentError, match="without verified inputs"):
        read_share_header(iter(to_h1), num_elements=len(values))


def _server_config(tmp_path: Path, **extra) -> ServerConfig:
    opts = DemoOptions(dataset="cancer", providers=3, rounds=2, insecure=True)
    opts.server_overrides.update(extra)
    servers, _ = write_configs(opts, tmp_path)
    return load_server_config(servers[0])


def test_the_plan_caps_the_batch_and_announces_the_proofs(tmp_path: Path) -> None:
    default = make_plan(_server_config(tmp_path / "c")).training_config("run")
    assert default.verify_inputs == "l2"  # the default in spgc (and dng)
    for mode, want in (("only-mpc", "none"), ("dng", "l2"), ("preprocessed", "l2")):
        assert _server_config(tmp_path / mode, mode=mode).verify_inputs == want
    plan = make_plan(_server_config(tmp_path / "a", verify_inputs="l2"))
    norm = plan.norm_proof
    assert norm is not None and norm.soundness_error <= 2.0**-40
    tc = plan.training_config("run")
    assert tc.verify_inputs == "l2" and tc.sharing_rule == pb.SHARING_RULE_SUM_MOD_P
    assert tc.norm_field_modulus == norm.p and tc.norm_repetitions == DEFAULT_REPETITIONS
    # A Poisson batch is capped where it overflows with probability 2^-64, and bounds the norm.
    assert 0 < tc.max_batch_size < 100
    assert tc.norm_bound_units == tc.max_batch_size * int(tc.l2_bound_units)
    assert norm_proof_params(tc, plan.share_dim).p == norm.p
    unverified = make_plan(_server_config(tmp_path / "b", verify_inputs="none"))
    unverified = unverified.training_config("run")
    assert unverified.verify_inputs == "none" and unverified.norm_field_modulus == 0
    # A provider recomputes the field and refuses another one; one that requires verified
    # inputs refuses a plan without them.
    tc.norm_field_modulus += 2
    with pytest.raises(ProviderRefusal, match="derives p ="):
        norm_proof_params(tc, plan.share_dim)
    strict = ProviderConfig(name="p1", h1_address="x:1", h2_address="y:2", insecure=True,
                            dataset="cancer", require_verified_inputs=True,
                            allow_no_privacy=True)  # fmt: skip
    with pytest.raises(ProviderRefusal, match="requires verified inputs"):
        check_plan(unverified, strict)


@pytest.mark.parametrize(("mode", "message"), [("ldp", "two servers"), ("plain", "two servers")])
def test_verified_inputs_are_refused_where_two_servers_cannot_check_them(
    tmp_path: Path, mode: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _server_config(tmp_path, verify_inputs="l2", mode=mode)


# The same path (a poisoning provider with its real keys, through both real daemons) runs in
@pytest.mark.parametrize(
    ("asked", "mode", "want"),
    [(None, "spgc", "l2"), ("none", "spgc", "none"), ("l2", "spgc", "l2"), (None, "plain", "none")],
)
def test_the_demo_and_bench_configs_say_none_when_asked(tmp_path: Path, asked, mode, want) -> None:
    """--verify-inputs none reaches the servers: left unset, their default (l2 in spgc) would
    verify, and bench load's unverified baseline would measure a verified run."""
    opts = DemoOptions(dataset="cancer", providers=2, rounds=1, verify_inputs=asked, mode=mode)
    servers, _ = write_configs(opts, tmp_path / "work")
    for path in servers:
        assert load_server_config(path).verify_inputs == want
    assert verifies_inputs(opts) == (want == "l2")
    bench = LoadOptions(providers=2, verify_inputs=asked, mode=mode)
    assert verified(bench) == want


# make test as bench load's small hostile run (test_bench_load.py), which also checks what the
# poisoners were told; this one, in the extended set, reads both servers' audit logs and the
# provider's own log line.
@pytest.mark.extended
def test_a_poisoning_provider_is_left_out_of_every_round_and_told_why(tmp_path: Path) -> None:
    work = tmp_path / "work"
    opts = DemoOptions(
        dataset="cancer", providers=2, rounds=2, insecure=True, verify_inputs="l2",
        server_overrides={"min_providers": 1, "evaluate": False},
    )  # fmt: skip
    servers, providers = write_configs(opts, work)
    procs = []
    try:
        for c in servers:
            procs.append(_start([sys.executable, "-m", "spgc.servers", "--config", str(c)], c))
        for i, c in enumerate(providers):
            # p2 sends 1,000 times its clipped vector, proved by our prover without its checks.
            script = (
                [str(TESTS_ROOT / "poison_provider.py")] if i == 1 else ["-m", "spgc.providers"]
            )
            procs.append(_start([sys.executable, *script, "--config", str(c)], c))
        for proc in procs:
            assert proc.wait(300) == 0, Path(proc.args[-1]).with_suffix(".log").read_text()[-2000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for name in ("h1", "h2"):
        summary = json.loads((work / f"{name}-summary.json").read_text())
        assert summary["finished"] and summary["verify_inputs"] == "l2"
        assert summary["model_version"] == 2
        audit = (work / f"{name}-state" / "audit.jsonl").read_text().splitlines()
        refused = [json.loads(x) for x in audit if '"norm_proof_refused"' in x]
        assert [(e["identity"], e["round"]) for e in refused] == [("p2", 0), ("p2", 1)]
        log = (work / f"{name}.log").read_text()
        assert log.count("providers received 2 used 1") == 2
    told = (work / "p2.log").read_text()
    assert "our share is not in the sum: its norm proof was refused" in told
    assert "not in the sum" not in (work / "p1.log").read_text()


def _start(cmd: list[str], config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdout=config.with_suffix(".log").open("w"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=config.parent,
    )


def test_a_refused_norm_proof_is_counted_in_the_metrics() -> None:
    metrics = ServerMetrics(epsilon=lambda: None, epsilon_budget=None)

    def refused() -> float | None:
        return metrics.registry.get_sample_value("spgc_shares_refused_total", {"reason": "norm"})

    assert refused() == 0.0  # the series exists before the first refusal
    metrics.on_audit("norm_proof_refused", {"identity": "p3", "round": 0, "reason": "..."})
    metrics.on_audit("provider_dropped", {"identity": "p2", "round": 0, "reason": "..."})
    assert refused() == 1.0
