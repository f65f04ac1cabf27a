"""Issue 46, item 5: a server whose inputs differ from what it committed (docs/MALICIOUS.md,
"Inputs bound to commitments"). The binding is not built; these tests pin down what such a
server can do instead, through the authenticated engines on both backends:

- trial bits that are not the expansion of its committed seed (zeros, ones, another seed, or
  the expansion of a seed it guesses the other server holds, chosen to cancel it): the noise
  is exactly the plan's discrete Gaussian all the same, because every trial bit is the xor of
  both servers' bits and the honest one's are uniform and unseen;
- a share of the sum other than the one the providers sent it (its own plus e): the release is
  S + e + z with z the noise of the round's seeds, the honest release moved by an e it chose
  before anything that depends on z: post-processing, never less noisy.

The control: a cheater that also held the other server's bits (both cancelled) gets a constant
"noise", which the same distribution test refuses, so the test can fail.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import numpy as np
import pytest
from test_gmw_round import run_both
from test_noise_sampler import assert_matches, distribution_tests
from test_spgc_circuit import shares_of, sums_for

from spgc.privacy import noise
from spgc.privacy.noise import derive_params, sample_noise_plain
from spgc.servers import gc_party
from spgc.servers.gc_party import PartyLink, aggregate_plain

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
