"""Issue 46, item 5: a server whose inputs differ from what it committed (docs/MALICIOUS.md,
"Inputs bound to commitments").

With seed proofs (what the daemons run under security: malicious, in mode spgc's rounds and
mode preprocessed's production), a server that proves and enters another seed than the one it
committed is caught before the run's trials, and one that binds its ports to other proved bits
than the layout's is caught by the run's MAC check (the tests at the end).

Without them (the runs below), what such a server could do is pinned down, through the
authenticated engines on both backends: the proofs add evidence, and privacy never depended
on them:

- trial bits that are not the expansion of its committed seed (zeros, ones, another seed, or
  the expansion of a seed it guesses the other server holds, chosen to cancel it): the noise
  is exactly the plan's discrete Gaussian all the same, because every trial bit is the xor of
  both servers' bits and the honest one's are uniform and unseen;
- a share of the sum other than the one the providers sent it (its own plus e; never bound):
  the release is S + e + z with z the noise of the round's seeds, the honest release moved by
  an e it chose before anything that depends on z: post-processing, never less noisy.

The control: a cheater that also held the other server's bits (both cancelled) gets a constant
"noise", which the same distribution test refuses, so the test can fail.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import Background
from test_gmw_round import run_both
from test_noise_sampler import assert_matches, distribution_tests
from test_spgc_circuit import shares_of, sums_for

import garbled_core
from spgc.privacy import noise
from spgc.privacy.noise import derive_params, sample_noise_plain
from spgc.privacy.seed_proof import SeedBinding, SeedProofError
from spgc.servers import gc_party
from spgc.servers.errors import PeerMismatchError
from spgc.servers.gc_party import PartyLink, aggregate_plain, run_aggregate
from spgc.servers.noise_pool import produce_noise_shares
from spgc.servers.pool_sync import BlockSeed
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import peer_pb2
from spgc.wire.digests import pool_seed_commitment, seed_commitment

Ports = dict[str, np.ndarray]
#: What a cheating H1 enters instead of its seed's expansion: f(honest ports, the run's
#: expansion arguments) -> its ports.
Cheat = Callable[[Ports, tuple], Ports]

GUESSED_H2_SEED = bytes(range(32))


def _zeros(ports: Ports, args: tuple) -> Ports:
    return {k: np.zeros_like(v) for k, v in ports.items()}


def _ones(ports: Ports, args: tuple) -> Ports:
    widths = args[2]
    return {
        k: np.full_like(v, np.uint64((1 << w) - 1 if w < 64 else (1 << 64) - 1))
        for (k, v), w in zip(ports.items(), widths, strict=True)
    }


def _another_seed(ports: Ports, args: tuple) -> Ports:
    return _REAL_EXPAND(b"\x5a" * 32, *args[1:])


def _cancel_guessed_h2(ports: Ports, args: tuple) -> Ports:
    """H2's expansion under a seed the cheater guesses, as H1's ports: were H2 to hold that
    seed, every trial bit would be 0."""
    theirs = _REAL_EXPAND(GUESSED_H2_SEED, args[1], args[2], "e", *args[4:])
    return {"g" + k[1:]: v for k, v in theirs.items()}


CHEATS: dict[str, Cheat] = {
    "zeros": _zeros,
    "ones": _ones,
    "another_seed": _another_seed,
    "cancel_a_guessed_h2_seed": _cancel_guessed_h2,
}
_REAL_EXPAND = noise.expand_segments


def _cheating_expand(cheat: Cheat) -> Callable[..., Ports]:
    """expand_segments as a cheating H1 runs it: H2's ports ("e") as they are."""

    def expand(*args: object) -> Ports:
        ports = _REAL_EXPAND(*args)
        return cheat(ports, args) if args[3] == "g" else ports

    return expand


@pytest.mark.parametrize("cheat", list(CHEATS))
@pytest.mark.parametrize("sigma", [2.0, 1000.0])
def test_trial_bits_not_from_the_seed_leave_the_noise_exact(monkeypatch, sigma, cheat):
    monkeypatch.setattr(noise, "expand_segments", _cheating_expand(CHEATS[cheat]))
    n = 200_000
    s2 = hashlib.sha256(f"input cheats {sigma} {cheat}".encode()).digest()  # fixed: no flakes
    z = sample_noise_plain(b"\x01" * 32, s2, n, sigma)
    assert len(z) == n and int(np.abs(z).max()) <= derive_params(sigma).noise_bound
    assert_matches(distribution_tests(z, sigma, derive_params(sigma).noise_bound))


def test_the_control_a_cheater_holding_both_servers_bits_is_refused(monkeypatch):
    """The same test refuses the noise when the guessed H2 seed is H2's: every bit cancels."""
    monkeypatch.setattr(noise, "expand_segments", _cheating_expand(_cancel_guessed_h2))
    sigma = 1000.0
    z = sample_noise_plain(b"\x01" * 32, GUESSED_H2_SEED, 20_000, sigma)
    assert len(set(z.tolist())) == 1  # no randomness left
    with pytest.raises(AssertionError):
        assert_matches(distribution_tests(z, sigma, derive_params(sigma).noise_bound))


@pytest.mark.parametrize("backend", ["gmw", "gc"])
def test_a_malicious_server_whose_inputs_differ_from_its_commitment(
    two_party, monkeypatch, backend
):
    """Through the authenticated engine (every round on fresh seeds: a seed is never used
    twice): H1 enters trial bits of another seed than the one it committed, then a share of
    the sum moved by e. Both servers release the same values, and the release is, value for
    value, the plaintext reference for the bits and the share that H1 entered: noise exact by
    the test above, and the share cheat's release the honest S + e + z."""
    ring_bits, sigma = 16, 1000.0
    full = 1 << ring_bits
    sums = sums_for(ring_bits, 40, 11)
    a1, a2 = shares_of(sums, ring_bits, 12)
    tp = two_party()
    lg = PartyLink.open("garbler", tp.garbler_channel, backend=backend, security="malicious")
    le = PartyLink.open("evaluator", tp.evaluator_channel, backend=backend, security="malicious")

    def ring(values: np.ndarray) -> list[int]:
        return [int(v) % full for v in values]

    def reference(share1: np.ndarray, s1: bytes, s2: bytes) -> list[int]:
        y = aggregate_plain(
            share1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma,
            backend=backend, security="malicious",
        )  # fmt: skip
        return ring(y)

    # trial bits of another seed than the committed s1
    s1, s2 = os.urandom(32), os.urandom(32)
    monkeypatch.setattr(gc_party, "expand_segments", _cheating_expand(_another_seed))
    yg, ye, _, _ = run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, "spgc")
    monkeypatch.setattr(noise, "expand_segments", _cheating_expand(_another_seed))
    entered = reference(a1, s1, s2)
    monkeypatch.undo()
    assert ring(yg) == ring(ye) == entered
    assert entered != reference(a1, s1, s2)  # it did change the bits

    # a share of the sum moved by e: S + e plus the noise of the seeds
    s1, s2 = os.urandom(32), os.urandom(32)
    e = np.array([(7 * i + 3) % full for i in range(len(sums))], dtype=np.uint64)
    moved = (a1 + e) % np.uint64(full)
    yg, ye, _, _ = run_both(lg, le, moved, a2, s1, s2, sigma, ring_bits, "spgc")
    assert ring(yg) == ring(ye) == reference(moved, s1, s2)
    shift = [(y - h) % full for y, h in zip(ring(ye), reference(a1, s1, s2), strict=True)]
    assert shift == e.tolist()


# ---------------------------------------------------------------- inputs bound to commitments


def _bindings(run_id: str, t: int, c1: bytes, c2: bytes):
    """Each server's SeedBinding: the peer's commitment as it sent it."""
    h1, h2 = pb.SERVER_ROLE_H1, pb.SERVER_ROLE_H2
    return SeedBinding(run_id, t, h1, h2, c2), SeedBinding(run_id, t, h2, h1, c1)


def links_semi_honest(two_party):
    tp = two_party()
    return (
        PartyLink.open("garbler", tp.garbler_channel, backend="gmw"),
        PartyLink.open("evaluator", tp.evaluator_channel, backend="gmw"),
    )


def _malicious_links(two_party, backend: str):
    tp = two_party()
    return (
        PartyLink.open("garbler", tp.garbler_channel, backend=backend, security="malicious"),
        PartyLink.open("evaluator", tp.evaluator_channel, backend=backend, security="malicious"),
    )


def _bound_round(lg, le, a1, a2, s1_entered, s2, bindings, sigma, ring_bits):
    """Both servers' sides with seed proofs: H1 enters (and proves) ``s1_entered``. Returns
    (H1's outcome, H2's outcome), each the result or the exception it raised."""
    b1, b2 = bindings

    def h1():
        return run_aggregate(
            "garbler", lg, a1, s1_entered, sigma, ring_bits, "spgc", seed_binding=b1
        )

    return _both_sides(
        h1,
        lambda: run_aggregate("evaluator", le, a2, s2, sigma, ring_bits, "spgc", seed_binding=b2),
        le,
    )


def _both_sides(h1, h2, le):
    """H1's side in a thread, H2's here: (H1's outcome, H2's outcome), each the result or the
    exception it raised. H2's link is closed when H2 fails: the cheater may wait for a run
    that never comes."""
    side = Background(h1)
    try:
        second = h2()
    except Exception as exc:
        second = exc
        le.channel.close()
    try:
        first = side.result(timeout=300)
    except Exception as exc:
        first = exc
    return first, second


@pytest.mark.parametrize("backend", ["gmw", "gc"])
def test_with_seed_proofs_the_release_is_the_committed_seeds_and_a_false_seed_is_caught(
    two_party, backend
):
    """Under seed proofs (what the daemons run under security: malicious) the honest release is
    exactly the reference of the two committed seeds; a server that proves and enters another
    seed than the one it committed is caught by the other before any run of the round."""
    ring_bits, sigma = 16, 1000.0
    sums = sums_for(ring_bits, 30, 21)
    a1, a2 = shares_of(sums, ring_bits, 22)

    s1, s2 = os.urandom(32), os.urandom(32)
    c1, c2 = seed_commitment("run-b", 4, 1, s1), seed_commitment("run-b", 4, 2, s2)
    lg, le = _malicious_links(two_party, backend)
    (yg, _), (ye, _) = _bound_round(
        lg, le, a1, a2, s1, s2, _bindings("run-b", 4, c1, c2), sigma, ring_bits
    )
    reference = aggregate_plain(
        a1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma,
        backend=backend, security="malicious",
    )  # fmt: skip
    assert [int(v) for v in yg] == [int(v) for v in ye] == [int(v) for v in reference]
    assert le.session.ands_proved > 0 and lg.session.ands_proved == le.session.ands_proved

    # H1 committed to s1 but proves and enters s1': H2 refuses before the round's run
    s1, s2 = os.urandom(32), os.urandom(32)
    c1, c2 = seed_commitment("run-b", 5, 1, s1), seed_commitment("run-b", 5, 2, s2)
    lg, le = _malicious_links(two_party, backend)
    runs_before = le.session.runs
    first, caught = _bound_round(
        lg, le, a1, a2, os.urandom(32), s2, _bindings("run-b", 5, c1, c2), sigma, ring_bits
    )
    assert isinstance(caught, SeedProofError), caught
    assert isinstance(caught, garbled_core.PeerDeviated)  # the servers abort on it as on any
    assert "not its committed seed" in str(caught)
    assert le.session.runs == runs_before  # no run of the round began
    assert isinstance(first, Exception)


@pytest.mark.parametrize("backend", ["gmw", "gc"])
def test_a_server_that_enters_other_proved_bits_than_its_ports_is_caught(
    two_party, monkeypatch, backend
):
    """H1 proves its committed seed, then binds its ports to other words of its own proved
    stream (authenticated bits, only misplaced; the adaptive cheat once the seed is proved):
    H2's keys are of the words the layout names, so the run's MAC check catches it before any
    output. The control: the same rebinding on both sides (no cheat) releases normally."""
    ring_bits, sigma = 16, 1000.0
    sums = sums_for(ring_bits, 30, 23)
    a1, a2 = shares_of(sums, ring_bits, 24)
    real = gc_party.bound_random_ports

    def rebind(only_h1: bool):
        def bound(session, role, commitments, layout, widths):
            if only_h1 and role != "garbler":
                return real(session, role, commitments, layout, widths)
            moved = noise.StreamLayout(
                layout.counters, layout.nonces, layout.block, (layout.word + 1) % 8
            )
            return real(session, role, commitments, moved, widths)

        return bound

    for only_h1 in (False, True):
        monkeypatch.setattr(gc_party, "bound_random_ports", rebind(only_h1))
        tp = two_party()
        lg = PartyLink.open("garbler", tp.garbler_channel, backend=backend, security="malicious")
        le = PartyLink.open(
            "evaluator", tp.evaluator_channel, backend=backend, security="malicious"
        )
        s1, s2 = os.urandom(32), os.urandom(32)
        t = 6 + only_h1
        c1, c2 = seed_commitment("run-c", t, 1, s1), seed_commitment("run-c", t, 2, s2)
        first, second = _bound_round(
            lg, le, a1, a2, s1, s2, _bindings("run-c", t, c1, c2), sigma, ring_bits
        )
        if only_h1:
            assert isinstance(second, garbled_core.PeerDeviated), second
            assert not isinstance(second, SeedProofError)  # the run's own check caught it
        else:
            assert not isinstance(second, Exception), second
            assert [int(v) for v in first[0]] == [int(v) for v in second[0]]


def test_a_round_that_cannot_prove_its_seeds_is_refused_not_run_unbound(two_party):
    """Seed proofs run in mode spgc's fused round; asked of another round, the server refuses
    before a byte instead of running it without them."""
    lg, _ = _malicious_links(two_party, "gmw")
    c1 = seed_commitment("run-d", 1, 1, os.urandom(32))
    binding = _bindings("run-d", 1, c1, seed_commitment("run-d", 1, 2, os.urandom(32)))[0]
    shares = np.zeros(4, dtype=np.uint64)
    before = lg.counters()
    with pytest.raises(ValueError, match="seed proofs run in mode spgc's fused round"):
        run_aggregate("garbler", lg, shares, None, None, 16, "only-mpc", seed_binding=binding)
    assert lg.counters() == before  # nothing sent


# ------------------------------------------------ mode preprocessed's production, bound too


def _pool_bindings(run_id: str, index: int, block_id: bytes, c1: bytes, c2: bytes):
    h1, h2 = pb.SERVER_ROLE_H1, pb.SERVER_ROLE_H2
    return (
        SeedBinding(run_id, index, h1, h2, c2, block_id),
        SeedBinding(run_id, index, h2, h1, c1, block_id),
    )


def _bound_production(lg, le, n, s1_entered, s2, bindings, sigma, ring_bits):
    """Both servers' sides of one production run with seed proofs: H1 enters (and proves)
    ``s1_entered``. Returns (H1's outcome, H2's outcome), each (shares, info) or the exception
    it raised."""
    b1, b2 = bindings

    def h1():
        return produce_noise_shares(
            "garbler", lg, n, sigma, ring_bits, s1_entered, seed_binding=b1
        )

    return _both_sides(
        h1,
        lambda: produce_noise_shares(
            "evaluator", le, n, sigma, ring_bits, s2, seed_binding=b2
        ),
        le,
    )


@pytest.mark.parametrize("backend", ["gmw", "gc"])
def test_production_with_seed_proofs_makes_the_committed_seeds_noise_and_catches_a_false_seed(
    two_party, backend
):
    """Mode preprocessed's production under security: malicious: the block's shares add up to
    exactly the plaintext sampler's noise of the two committed seeds (its trials read the
    proved streams), and a server that proves and enters another seed than its
    "sha256-pool-v1" commitment is caught by the other before any trial of the run."""
    ring_bits, sigma, n = 24, 50.0, 300
    block_id = os.urandom(16)
    s1, s2 = os.urandom(32), os.urandom(32)
    c1 = pool_seed_commitment("run-p", 3, block_id, 1, s1)
    c2 = pool_seed_commitment("run-p", 3, block_id, 2, s2)
    assert c1 != seed_commitment("run-p", 3, 1, s1)  # its own domain: never a round's
    lg, le = _malicious_links(two_party, backend)
    bindings = _pool_bindings("run-p", 3, block_id, c1, c2)
    (neg_r, _), (u, _) = _bound_production(lg, le, n, s1, s2, bindings, sigma, ring_bits)
    full = 1 << ring_bits
    total = [(int(a) + int(b)) % full for a, b in zip(neg_r, u, strict=True)]
    z = sample_noise_plain(s1, s2, n, sigma, spares_every=lg.spares_every)
    assert [v - full if v >= full // 2 else v for v in total] == z.tolist()
    assert le.session.ands_proved > 0 and lg.session.ands_proved == le.session.ands_proved

    # H1 committed to s1 but proves and enters s1': H2 refuses before the run's first trial
    s1, s2 = os.urandom(32), os.urandom(32)
    c1 = pool_seed_commitment("run-p", 4, block_id, 1, s1)
    c2 = pool_seed_commitment("run-p", 4, block_id, 2, s2)
    lg, le = _malicious_links(two_party, backend)
    runs_before = le.session.runs
    first, caught = _bound_production(
        lg, le, n, os.urandom(32), s2, _pool_bindings("run-p", 4, block_id, c1, c2), sigma,
        ring_bits,
    )  # fmt: skip
    assert isinstance(caught, SeedProofError), caught
    assert "noise block 4" in str(caught) and "not its committed seed" in str(caught)
    assert le.session.runs == runs_before
    assert isinstance(first, Exception)

    # the adaptive cheat once the seed is proved: H1 binds its ports to other proved words of
    # its own stream; H2's keys are of the layout's words, so the run's MAC check catches it
    real = gc_party.bound_random_ports

    def rebound(session, role, commitments, layout, widths):
        if role == "garbler":
            layout = noise.StreamLayout(
                layout.counters, layout.nonces, layout.block, (layout.word + 1) % 8
            )
        return real(session, role, commitments, layout, widths)

    s1, s2 = os.urandom(32), os.urandom(32)
    c1 = pool_seed_commitment("run-p", 5, block_id, 1, s1)
    c2 = pool_seed_commitment("run-p", 5, block_id, 2, s2)
    lg, le = _malicious_links(two_party, backend)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gc_party, "bound_random_ports", rebound)
        _, caught = _bound_production(
            lg, le, n, s1, s2, _pool_bindings("run-p", 5, block_id, c1, c2), sigma, ring_bits
        )
    assert isinstance(caught, garbled_core.PeerDeviated), caught
    assert not isinstance(caught, SeedProofError)  # the run's own check caught it


def test_production_refuses_seed_proofs_on_a_link_that_cannot_check_them(two_party):
    """A binding asked of a semi-honest link is refused before a byte, never run unbound."""
    lg, _ = links_semi_honest(two_party)
    c = pool_seed_commitment("run-q", 1, bytes(16), 2, os.urandom(32))
    binding = SeedBinding("run-q", 1, 1, 2, c, bytes(16))
    sent = lg.channel.bytes_sent
    with pytest.raises(ValueError, match="authenticated links only"):
        produce_noise_shares("garbler", lg, 10, 50.0, 24, os.urandom(32), seed_binding=binding)
    assert lg.channel.bytes_sent == sent


def test_a_block_without_the_peers_seed_commitment_is_refused():
    """Under security: malicious each server needs the other's commitment for the block before
    the run: none, one of another block, role or scheme, or not 32 bytes, is refused in one
    line (the run never starts unbound)."""
    state = SimpleNamespace(
        plan=SimpleNamespace(cfg=SimpleNamespace(security="malicious")),
        run_id="run-s", role=pb.SERVER_ROLE_H1,
    )  # fmt: skip
    block = peer_pb2.PoolBlock(index=3, block_id=bytes(16), count=10)
    mine = BlockSeed(state, block)
    assert mine.proved and len(mine.commitment) == 32
    assert mine.commitment == pool_seed_commitment("run-s", 3, bytes(16), 1, mine.seed)

    def answer(**changes) -> peer_pb2.NoiseBlock:
        fields = {"run_id": "run-s", "round": 3, "role": pb.SERVER_ROLE_H2}
        fields.update(scheme="sha256-pool-v1", commitment=bytes(32))
        fields.update(changes)
        return peer_pb2.NoiseBlock(block=block, seed=peer_pb2.SeedCommitment(**fields))

    for bad in (
        peer_pb2.NoiseBlock(block=block),  # none
        answer(round=4),
        answer(role=pb.SERVER_ROLE_H1),
        answer(scheme="sha256-v1"),  # a round's commitment
        answer(commitment=bytes(31)),
    ):
        with pytest.raises(PeerMismatchError, match="no sha256-pool-v1 seed commitment"):
            BlockSeed(state, block).bind(bad)
    mine.bind(answer())
    assert mine.binding == SeedBinding("run-s", 3, 1, 2, bytes(32), bytes(16))
    assert mine.commitments() == {"h1": mine.commitment, "h2": bytes(32)}
    # semi-honest: no commitment made, none asked for
    state.plan.cfg.security = "semi-honest"
    plain = BlockSeed(state, block)
    plain.bind(peer_pb2.NoiseBlock(block=block))
    assert plain.message() is None and plain.commitments() is None
