"""Authenticated AND triples (auth_triples.h, layer 2 of docs/MALICIOUS.md): the leaky AND of
Wang, Ranellucci and Katz and its bucketing. Honest triples satisfy c = a AND b with a and b
uniform; every deviation in the leaky AND is caught, except the one the protocol prices in (a
wrong U with a guess of the honest party's x bit passes exactly when the guess is right), which
bucketing removes; the bucket size meets the 2^-rho bound.
"""

from __future__ import annotations

import math

import pytest
from helpers import Background

from garbled_core import _core


def session(two_party, n, **cheat):
    """H1 (first) may cheat; H2 is honest. Returns (H1's result, H2's result)."""
    tp = two_party()
    leaky_only = cheat.get("leaky_only", False)
    cheater = Background(lambda: _core._auth_triples_session(tp.garbler_channel, True, n, **cheat))
    honest = _core._auth_triples_session(tp.evaluator_channel, False, n, leaky_only=leaky_only)
    if honest["caught"]:
        tp.evaluator_channel.close()  # the cheater may wait for openings that never come
    try:
        first = cheater.result()
    except _core.ChannelError:
        first = None
    return first, honest


@pytest.mark.parametrize("leaky_only", [False, True])
def test_honest_triples_are_and_triples(two_party, leaky_only):
    n = 1500
    first, second = session(two_party, n, leaky_only=leaky_only)
    assert not first["caught"] and not second["caught"]
    assert first["a"] == second["a"] and first["c"] == second["c"]
    a, b, c = second["a"], second["b"], second["c"]
    assert all(ci == ai & bi for ai, bi, ci in zip(a, b, c, strict=True))
    # a and b uniform (5 sigma), and a party's own share is not the value.
    for bits in (a, b):
        assert abs(sum(bits) - n / 2) < 5 * math.sqrt(n / 4)
    if not leaky_only:
        assert second["bucket"] == _core._bucket_size(n, 40) >= 3


@pytest.mark.parametrize("kind", ["half_and_flip", "correction_flip", "check_flip"])
def test_a_wrong_product_is_always_caught(two_party, kind):
    """A wrong half-AND message, a wrong correction of z, a wrong check value: z != x y (or
    the check differs), which only a guess of the joint Delta could hide."""
    for index in (0, 77, 199):
        _, honest = session(two_party, 200, leaky_only=True, cheat=kind, index=index)
        assert honest["caught"], (kind, index)
        assert "leaky AND" in honest["message"]


def test_a_batch_of_several_chunks_makes_and_triples_across_their_boundary(two_party):
    """A batch over one chunk interleaves its chunks (a chunk's corrections ride with the next
    one's first message): every triple of both chunks is an AND triple."""
    n = _core._LEAKY_CHUNK + 300
    first, second = session(two_party, n, leaky_only=True)
    assert not first["caught"] and not second["caught"]
    a, b, c = second["a"], second["b"], second["c"]
    assert len(c) == n and first["c"] == c
    assert all(ci == ai & bi for ai, bi, ci in zip(a, b, c, strict=True))


@pytest.mark.parametrize("kind", ["half_and_flip", "correction_flip", "check_flip"])
def test_a_cheat_in_any_chunk_of_a_batch_is_caught_at_the_batchs_check(two_party, kind):
    """The checks of a batch's chunks are compared once, after its last chunk: a cheat in the
    first chunk only (whose later chunks are honest) is caught there, as one in the last."""
    n = _core._LEAKY_CHUNK + 300
    for index in (5, _core._LEAKY_CHUNK + 7):
        _, honest = session(two_party, n, leaky_only=True, cheat=kind, index=index)
        assert honest["caught"], (kind, index)
        assert "leaky AND" in honest["message"]


def test_a_wrong_u_passes_exactly_when_it_guessed_the_honest_x(two_party):
    """The cheater adds an error to U and moves its own check value by guess * error: the
    honest check value moves by x_honest * error, so it passes iff guess == x_honest: the leak
    of one x bit, at the price of being caught half the time, that bucketing exists for."""
    outcomes = set()
    for trial in range(12):
        guess = trial % 2
        _, honest = session(two_party, 64, leaky_only=True, cheat="u_error", index=21, guess=guess)
        x = honest["own_x"][21]
        assert honest["caught"] == (guess != x), (trial, guess, x)
        outcomes.add(honest["caught"])
    assert outcomes == {True, False}  # both branches seen (probability 1 - 2^-11)


def test_bucket_size_meets_the_bound():
    for n in (1, 100, 10_000, 1_000_000, 100_000_000):
        b = _core._bucket_size(n, 40)
        assert _core._bucketing_error_log2(n, b) <= -40
        assert _core._bucketing_error_log2(n, b - 1) > -40 or b == 2
    # More triples, smaller buckets (the adversary must fill a whole bucket among more).
    assert _core._bucket_size(100, 40) > _core._bucket_size(1_000_000, 40)
    # The bound by hand for n = 1000, B = 4: max over t of 2^-t n C(t,4) / C(4000,4).
    worst = max(
        -t + math.log2(1000) + math.log2(math.comb(t, 4)) - math.log2(math.comb(4000, 4))
        for t in range(4, 40)
    )
    assert abs(_core._bucketing_error_log2(1000, 4) - worst) < 1e-6
    with pytest.raises(ValueError):
        _core._bucket_size(10, 0)
