"""The noise floor (issue 46 item 4) and the online opening of mode preprocessed (item 3), on
the servers' own code paths: each server's noise goes into what it opens, so the release is
S + J + N_1 + N_2; a garbler that leaves the joint noise out still leaves the honest server's
N; an opener of mode preprocessed that deviates only shifts the release."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from helpers import Background
from test_field_circuits import field_shares, modulus
from test_noise_pool import produce_both
from test_spgc_circuit import shares_of

from spgc.privacy import noise as noise_module
from spgc.privacy.noise import SPARES_EVERY, sample_noise_plain
from spgc.protocol.sharing import ring_mask
from spgc.servers import coordinator, noise_floor
from spgc.servers.coordinator import dng_exchange
from spgc.servers.gc_party import PartyLink, run_aggregate
from spgc.servers.noise_floor import draw_own_noise, spgc_release
from spgc.wire import aggregation_pb2 as pb

#: The honest opening, taken before any test stands a deviating one in its place.
HONEST_EXCHANGE = coordinator.opened_share_exchange

H1, H2 = pb.SERVER_ROLE_H1, pb.SERVER_ROLE_H2


def fixed_seed(label: str) -> bytes:
    """A fixed 32-byte seed of this module (the process refuses a round seed used before)."""
    return hashlib.sha256(b"test_noise_floor:" + label.encode()).digest()


def own_noise(label: str, n: int, sigma: float) -> np.ndarray:
    """A server's own noise drawn from fixed seeds (the exact sampler, as draw_own_noise)."""
    return sample_noise_plain(fixed_seed(label + "a"), fixed_seed(label + "b"), n, sigma)


def links(two_party, backend: str = "gc"):
    tp = two_party(chunk=512)
    if backend == "gmw":  # GMW parties on the pair's channels, as the data link opens them
        return (
            PartyLink.open("garbler", tp.garbler_channel, backend="gmw"),
            PartyLink.open("evaluator", tp.evaluator_channel, backend="gmw"),
        )
    return (
        PartyLink("garbler", tp.garbler_channel, tp.garbler),
        PartyLink("evaluator", tp.evaluator_channel, tp.evaluator),
    )


def release_both(lg, le, a1, a2, s1, s2, own1, own2, joint_sigma, ring_bits, field=None):
    kw = {"joint_sigma_units": joint_sigma, "ring_bits": ring_bits, "field_modulus": field}
    side = Background(lambda: spgc_release(H1, lg, a1, s1, own1, **kw))
    y2, _ = spgc_release(H2, le, a2, s2, own2, **kw)
    y1, _ = side.result()
    return y1, y2


@pytest.mark.parametrize(("field", "backend"), [(False, "gc"), (True, "gc"), (True, "gmw")])
def test_the_release_is_s_plus_the_joint_noise_plus_both_own_noises(two_party, field, backend):
    """Fixed seeds: the circuit's joint noise at sqrt(1 - f) sigma (the plaintext sampler on
    both round seeds) plus each server's own noise at sqrt(f) sigma, exactly."""
    ring_bits, sigma, f, n = 32, 3000.0, 0.25, 600
    rng = np.random.default_rng(7)
    sums = [int(v) for v in rng.integers(-(1 << 20), 1 << 20, n)]
    if field:
        p = modulus(ring_bits)
        a1, a2 = field_shares(sums, p, 11)
    else:
        p = None
        a1, a2 = shares_of(sums, ring_bits, 11)
    tag = f"field={field},{backend}"
    s1, s2 = fixed_seed(tag + "round1"), fixed_seed(tag + "round2")
    own1, own2 = own_noise(tag + "n1", n, sigma * f**0.5), own_noise(tag + "n2", n, sigma * f**0.5)
    joint_sigma = sigma * (1 - f) ** 0.5
    y1, y2 = release_both(*links(two_party, backend), a1, a2, s1, s2, own1, own2, joint_sigma,
                          ring_bits, p)  # fmt: skip
    joint = sample_noise_plain(s1, s2, n, joint_sigma, spares_every=SPARES_EVERY[backend])
    expected = np.array(sums) + joint + own1 + own2
    assert y1.tolist() == y2.tolist() == expected.tolist()


def test_each_servers_own_noise_is_fresh_and_of_variance_f_sigma2(monkeypatch):
    """draw_own_noise takes two fresh seeds from the OS CSPRNG per release; here that stream is
    replaced by a fixed one (so the figures are fixed), which still hands out new seeds."""
    stream = iter(fixed_seed(f"urandom{i}") for i in range(100))
    asked: list[int] = []

    def urandom(k: int) -> bytes:
        asked.append(k)
        return next(stream)[:k]

    monkeypatch.setattr(noise_module.os, "urandom", urandom)
    sigma, f, n = 400.0, 0.25, 20_000
    first = draw_own_noise(n, sigma * f**0.5)
    second = draw_own_noise(n, sigma * f**0.5)
    assert asked == [32, 32, 32, 32]  # two fresh 32-byte seeds per draw
    assert first is not None and second is not None
    assert first.dtype == np.int64 and len(first) == n
    assert not np.array_equal(first, second)  # two releases never share a draw
    for draw in (first, second):  # within 10% of f sigma^2 (the standard error is 1%)
        assert np.var(draw) == pytest.approx(f * sigma**2, rel=0.10)
    assert draw_own_noise(n, 0.0) is None  # no floor, nothing drawn


def test_a_garbler_that_leaves_out_the_joint_noise_still_leaves_the_honest_servers(
    two_party, monkeypatch
):
    """The cheating H1 garbles Y = A1 - A2 (the reconstruction alone) in place of the round
    circuit, at the named point noise_floor.joint_noise_circuit; the honest H2 evaluates what
    it is given, as it must. H2's input already carries N_2: the release minus S minus the
    cheater's own N_1 has the variance f sigma^2 of the honest server's noise."""
    ring_bits, sigma, f, n = 40, 400.0, 0.25, 20_000

    def without_joint_noise(role, link, shares, seed, sigma_units, ring, mode, **kw):
        return run_aggregate(role, link, shares, None, None, ring, "only-mpc",
                             field_modulus=kw.get("field_modulus"))  # fmt: skip

    monkeypatch.setattr(noise_floor, "joint_noise_circuit", without_joint_noise)
    rng = np.random.default_rng(3)
    sums = [int(v) for v in rng.integers(-(1 << 30), 1 << 30, n)]
    a1, a2 = shares_of(sums, ring_bits, 5)
    cheater_own = own_noise("cheater", n, sigma * f**0.5)
    honest_own = own_noise("honest", n, sigma * f**0.5)
    y1, y2 = release_both(*links(two_party), a1, a2, fixed_seed("cheat1"), fixed_seed("cheat2"),
                          cheater_own, honest_own, sigma * (1 - f) ** 0.5, ring_bits)  # fmt: skip
    assert y1.tolist() == y2.tolist()
    left = np.asarray(y1, dtype=np.int64) - np.array(sums) - cheater_own
    np.testing.assert_array_equal(left, honest_own)  # exactly the honest server's noise
    assert np.var(left) == pytest.approx(f * sigma**2, rel=0.10)
    assert np.var(left) > 0.2 * sigma**2  # not a noise-free sum


@pytest.mark.parametrize(
    "deviation",
    ["constant", "strip_own_pool_share", "function_of_its_view"],
)
def test_a_deviating_opener_of_preprocessed_only_shifts_the_release(
    two_party, monkeypatch, deviation
):
    """Item 3: the pool share of each server is its share of z masked by the other's uniform
    r; whatever H1 sends instead of A1 + its share (an offset, its share left out, any function
    of what it holds) shifts the release by a value fixed by H1's own view, so the release is
    the honest one plus that offset, and the noise in it, as the honest H2 sees it, is z + N_1 +
    N_2 as before."""
    ring_bits, sigma, f, n = 40, 300.0, 0.25, 3000
    lg, le = links(two_party)
    p1, p2 = fixed_seed(deviation + "p1"), fixed_seed(deviation + "p2")
    joint_sigma = sigma * (1 - f) ** 0.5
    neg_r, u, _, _ = produce_both(lg, le, n, joint_sigma, ring_bits, p1, p2)
    z = sample_noise_plain(p1, p2, n, joint_sigma)
    rng = np.random.default_rng(9)
    sums = np.array([int(v) for v in rng.integers(-(1 << 25), 1 << 25, n)], dtype=np.int64)
    a1, a2 = shares_of(sums.tolist(), ring_bits, 13)
    own1 = own_noise(deviation + "n1", n, sigma * f**0.5)
    own2 = own_noise(deviation + "n2", n, sigma * f**0.5)
    noise1 = neg_r.view(np.int64) + own1  # as compute_round forms each server's noise
    noise2 = u.view(np.int64) + own2
    mask = ring_mask(ring_bits)

    def offset(mine: np.ndarray) -> np.ndarray:
        """What H1 adds to its opened share: a function of what H1 holds only."""
        if deviation == "constant":
            return np.full(n, 12345, dtype=np.uint64)
        if deviation == "strip_own_pool_share":
            return (-neg_r.astype(np.uint64)) & mask  # sends A1 + N_1 alone
        digest = hashlib.sha256(a1.tobytes() + neg_r.tobytes() + mine.tobytes()).digest()
        return np.random.default_rng(list(digest)).integers(0, 1 << ring_bits, n, dtype=np.uint64)

    def open_both(deviate: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sent_offset: dict[str, np.ndarray] = {}
        honest_exchange = HONEST_EXCHANGE

        def deviating_exchange(role, channel, mine):
            if role == H1 and deviate:  # the named point: what H1 sends in the opening
                sent_offset["d"] = offset(mine)
                mine = (mine + sent_offset["d"]) & mask
            return honest_exchange(role, channel, mine)

        monkeypatch.setattr(coordinator, "opened_share_exchange", deviating_exchange)
        side = Background(lambda: dng_exchange(H1, lg.channel, a1, noise1, ring_bits))
        y2, _ = dng_exchange(H2, le.channel, a2, noise2, ring_bits)
        y1, _ = side.result()
        return y1, y2, sent_offset.get("d", np.zeros(n, dtype=np.uint64))

    honest1, honest2, _ = open_both(False)
    assert honest1.tolist() == honest2.tolist() == (sums + z + own1 + own2).tolist()
    _, y2, d = open_both(True)
    # H2's release is the honest one plus the offset (mod 2^L, read signed)
    shifted = (honest2.view(np.uint64) + d) & mask
    half = np.uint64(1 << (ring_bits - 1))
    expect = np.where(shifted >= half, shifted.astype(np.int64) - (1 << ring_bits), shifted)
    assert np.asarray(y2, dtype=np.int64).tolist() == expect.astype(np.int64).tolist()
    # The noise the release carries, offset aside, is the honest noise: nothing removed it.
    back = (np.asarray(y2, dtype=np.int64).view(np.uint64) - d) & mask
    back = np.where(back >= half, back.astype(np.int64) - (1 << ring_bits), back)
    np.testing.assert_array_equal(back.astype(np.int64) - sums, z + own1 + own2)
    # And what H1 can take off (its offset, its own N_1) leaves z + N_2, variance sigma^2.
    assert np.var(back.astype(np.int64) - sums - own1) == pytest.approx(sigma**2, rel=0.15)


def test_what_h2_receives_in_the_opening_is_the_release_and_its_own_values(two_party):
    """Item 3, H2's side: H2 answers after it has H1's opened share o_1, so it may choose what it
    sends from o_1 too. But o_1 is Y + o_2 (mod 2^L), o_2 made of H2's own values (its sum A2,
    its pool share z + r, its N_2), which are independent of the data and of z: H2's whole view
    is a function of the honest release Y and of them, so whatever it sends, what H1 opens is a
    post-processing of Y, never less noisy (docs/PRIVACY.md)."""
    ring_bits, sigma, f, n = 40, 300.0, 0.25, 2000
    lg, le = links(two_party)
    p1, p2 = fixed_seed("h2-view-p1"), fixed_seed("h2-view-p2")
    neg_r, u, _, _ = produce_both(lg, le, n, sigma * (1 - f) ** 0.5, ring_bits, p1, p2)
    rng = np.random.default_rng(21)
    sums = [int(v) for v in rng.integers(-(1 << 25), 1 << 25, n)]
    a1, a2 = shares_of(sums, ring_bits, 23)
    own1 = own_noise("h2-view-n1", n, sigma * f**0.5)
    own2 = own_noise("h2-view-n2", n, sigma * f**0.5)
    received: dict[int, np.ndarray] = {}
    sent: dict[int, np.ndarray] = {}
    honest_exchange = HONEST_EXCHANGE

    def recording_exchange(role, channel, mine):
        theirs = honest_exchange(role, channel, mine)
        sent[role], received[role] = mine, theirs
        return theirs

    mp = pytest.MonkeyPatch()
    mp.setattr(coordinator, "opened_share_exchange", recording_exchange)
    try:
        noise1 = neg_r.view(np.int64) + own1
        side = Background(lambda: dng_exchange(H1, lg.channel, a1, noise1, ring_bits))
        y, _ = dng_exchange(H2, le.channel, a2, u.view(np.int64) + own2, ring_bits)
        side.result()
    finally:
        mp.undo()
    mask = ring_mask(ring_bits)
    # H2's own message, from its own values alone: A2 - (z + r) - N_2
    o_2 = (a2 - u - own2.view(np.uint64)) & mask
    np.testing.assert_array_equal(sent[H2], o_2)
    # what it received is the release plus that: nothing of the data beyond Y
    y_ring = np.asarray(y, dtype=np.int64).view(np.uint64)
    np.testing.assert_array_equal(received[H2], (y_ring + o_2) & mask)
