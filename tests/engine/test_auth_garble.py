"""Authenticated garbling (auth_garble.h, layer 3b of docs/MALICIOUS.md: Wang, Ranellucci and
Katz 2017 over our authenticated bits and AND triples): the two servers get the plaintext
evaluator's outputs (the run interface's tests, gadgets, random circuits, reveal kinds, keep and
carry, run on it in test_gmw.py; here the sampler's circuit), in a number of round trips that
does not grow with the circuit's depth, and a server that deviates is caught with PeerDeviated
before any output computed from its messages is revealed: a garbler that garbles another
circuit (the noise left out) under the agreed one's name, one that flips a gate's output in its
table (also with a guessed MAC offset), a party that lies in an opening, an input mask, an
output share or the triples.

Each cheater is a real party with valid keys made to deviate at a named point, and each has an
honest control beside it (the same run without the deviation, or the cheater handed the honest
party's true Delta, which only a MAC can stop; or semi-honest garbling, which misses the cheat).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest
from helpers import Background
from test_auth_gmw import (
    NOISY_SUM_H1,
    NOISY_SUM_H2,
    XS,
    YS,
    adder,
    cheat,
    check_trial_circuit,
    noisy_sum,
    setup_both,
)
from test_gmw import GmwPair

from garbled_core import (
    AUTH_TABLE_BYTES,
    AuthGarbleParty,
    AuthGmwParty,
    ChannelError,
    CircuitBuilder,
    Evaluator,
    Garbler,
    PeerDeviated,
    ProtocolError,
)


@pytest.fixture
def garble_pair():
    """H1 (garbler) and H2 (evaluator) authenticated-garbling parties over loopback, on the
    TEST-ONLY silent OT, making each run's triples as it needs them; closed after the test."""
    made: list[GmwPair] = []

    def make(kind: Any = AuthGarbleParty, **kw: Any) -> GmwPair:
        kw = {"ot": "silent-test-only", "triple_batch": 0, **kw}
        made.append(GmwPair(make_party=lambda ch, role: kind(ch, role, **kw)))
        return made[-1]

    yield make
    for pair in made:
        pair.close()


def chain(width: int, steps: int):
    """x + y, then (steps - 1) times: s = s + (s rotated by one bit), whose top carry feeds the
    next step's lowest bit: AND-depth about steps * width (chained adders alone would run in
    lock-step, one layer apart)."""
    b = CircuitBuilder(f"chain-{width}-{steps}")
    x = b.input("x", owner="garbler", width=width)
    y = b.input("y", owner="evaluator", width=width)
    acc = b.add(x, y)
    for _ in range(steps - 1):
        acc = b.add(acc, acc[width - 1 :].concat(acc[: width - 1]))
    b.output("s", acc, reveal="both")
    return b.build()


# ---------------------------------------------------------------- the outputs are right


def test_trial_circuit_of_the_sampler(garble_pair):
    """The noise's own circuit (the ripple build gc garbles): accept bits and noise equal the
    plaintext evaluator's."""
    check_trial_circuit(garble_pair(), seed=7)


def test_round_trips_do_not_grow_with_depth(garble_pair):
    """One exchange for the masks of every AND gate, then the tables one way: a run 8 times
    deeper takes the same round trips on garbling, while authenticated GMW takes one per AND
    layer. The tables are 81 bytes per AND gate and instance (row (0, 0)'s 64-bit MAC, 3 rows of
    a 16-byte label part and a MAC, and the 4 mask bits), sent by H1 only."""
    n = 16
    xs = np.arange(n, dtype=np.uint64) * np.uint64(977)
    ys = np.arange(n, dtype=np.uint64) * np.uint64(31) + np.uint64(5)
    trips = {}
    for kind in (AuthGarbleParty, AuthGmwParty):
        for steps in (1, 8):
            circuit = chain(16, steps)
            # Triples made beforehand (a stock for both runs) and COTs from checked IKNP (a
            # fixed number of round trips per draw, where silent OT's iterations would start
            # wherever a draw crosses one), so that the run's own exchanges are what is counted.
            batch = (circuit.and_count + chain(16, 1).and_count) * n
            pair = garble_pair(kind, triple_batch=batch, ot="iknp")
            setup_both(pair)
            pair.run(chain(16, 1), {"x": xs}, {"y": ys})  # makes the stock, warms the OT
            before = pair.h2_channel.round_trips
            sent_before = pair.h1_channel.counters()["tables"]["sent"]
            out1, out2 = pair.run(circuit, {"x": xs}, {"y": ys})
            want = circuit.evaluate({"x": xs, "y": ys})["s"]
            assert np.array_equal(out1["s"], want) and np.array_equal(out2["s"], want)
            trips[kind, steps] = pair.h2_channel.round_trips - before
            if kind is AuthGarbleParty:
                assert pair.h1.last_layers == pair.h2.last_layers == 1
                tables = pair.h1_channel.counters()["tables"]["sent"] - sent_before
                assert tables >= AUTH_TABLE_BYTES * circuit.and_count * n
    assert trips[AuthGarbleParty, 8] == trips[AuthGarbleParty, 1]
    assert trips[AuthGmwParty, 8] > trips[AuthGmwParty, 1] + 8
    assert trips[AuthGarbleParty, 8] < trips[AuthGmwParty, 8]


def test_a_peer_of_another_backend_is_refused_at_setup(garble_pair):
    pair = garble_pair()
    other = AuthGmwParty(pair.h2_channel, "evaluator", ot="silent-test-only", triple_batch=0)
    side = Background(pair.h1.setup)
    with pytest.raises(ProtocolError, match="backend mismatch"):
        other.setup()
    with pytest.raises(ProtocolError, match="backend mismatch"):
        side.result()


def test_a_semi_honest_garbling_peer_is_refused_at_setup(garble_pair):
    pair = garble_pair()
    plain = Evaluator(pair.h2_channel)
    side = Background(pair.h1.setup)
    with pytest.raises(ProtocolError):
        plain.setup()
    with pytest.raises(ProtocolError, match="security mismatch"):
        side.result()


# ---------------------------------------------------------------- the cheaters


@pytest.mark.parametrize("index", [0, 7, 200, 639])
def test_a_garbler_that_flips_a_gates_output_in_its_table_is_caught(garble_pair, index):
    """H1 flips the output bit r^A in all four rows of one gate instance (so H2's row is one of
    them whatever the masks), leaving the MAC as it was: H2's check of the row fails."""
    pair = garble_pair()
    pair.h1._deviate_for_test("flip_row", index)
    err = cheat(pair, adder(), {"x": XS}, {"y": YS})
    assert "garbled row" in str(err) and "agreed circuit" in str(err)


def test_a_flipped_row_with_a_guessed_mac_offset_is_caught(garble_pair):
    pair = garble_pair()
    guess = bytearray(secrets.token_bytes(16))
    guess[0] |= 1
    pair.h1._deviate_for_test("flip_row", 5, bytes(guess))
    err = cheat(pair, adder(), {"x": XS}, {"y": YS})
    assert "garbled row" in str(err)


def test_control_a_flipped_row_with_the_true_delta_passes_and_changes_the_output(garble_pair):
    """Handed H2's Delta, the same cheater is accepted and its flipped gate changes the sum:
    the row's MAC, and nothing else, is what stops it."""
    pair = garble_pair()
    setup_both(pair)
    circuit = adder()
    expected = circuit.evaluate({"x": XS, "y": YS})["s"]
    # Gate instance 5 is an AND gate of instance 5 of the adder's carry chain (gate 0).
    pair.h1._deviate_for_test("flip_row", 5, pair.h2._delta_for_test())
    out1, out2 = pair.run(circuit, {"x": XS}, {"y": YS})
    assert np.array_equal(out1["s"], out2["s"])
    assert not np.array_equal(out2["s"], expected)


def test_a_garbler_that_garbles_the_circuit_without_the_noise_is_caught(garble_pair):
    """Issue 46's first cheater: H1 states the agreed circuit's hash and garbles one that
    leaves H2's noise out (the same AND gates, one XOR fewer, its own noise zero). Its tables
    and masks follow the other circuit; H2 evaluates the agreed one, and the first row whose
    labels differ fails its MAC (or the masks' openings fail the deferred check): caught before
    any output is sent."""
    pair = garble_pair()
    real = noisy_sum()
    pair.h1._claim_circuit_for_test(real.hash)
    side = Background(
        lambda: pair.h1.run(noisy_sum(leave_out_peer_noise=True), NOISY_SUM_H1, {}, None)
    )
    with pytest.raises(PeerDeviated):
        pair.h2.run(real, NOISY_SUM_H2, {}, None)
    pair.h2_channel.close()
    with pytest.raises((ChannelError, PeerDeviated)):
        side.result()


def test_control_semi_honest_garbling_misses_the_circuit_without_the_noise(garble_pair):
    """The control: semi-honest garbling (three-halves) evaluates H1's other tables to the end
    and releases a sum without H2's noise, unnoticed, which only authenticated garbling stops;
    and the hook alone (H1 states the agreed hash and garbles the agreed circuit) is accepted."""
    real = noisy_sum()
    want = real.evaluate({**NOISY_SUM_H1, **NOISY_SUM_H2})["y"]
    plain = GmwPair(make_party=lambda ch, role: Garbler(ch) if role == "garbler" else Evaluator(ch))
    try:
        plain.h1._claim_circuit_for_test(real.hash)
        side = Background(
            lambda: plain.h1.run(noisy_sum(leave_out_peer_noise=True), NOISY_SUM_H1, {}, None)
        )
        y2 = plain.h2.run(real, NOISY_SUM_H2, {}, None)["y"]
        side.result()
        assert not np.array_equal(y2, want)
    finally:
        plain.close()
    pair = garble_pair()
    pair.h1._claim_circuit_for_test(real.hash)
    out1, out2 = pair.run(real, NOISY_SUM_H1, NOISY_SUM_H2)
    assert np.array_equal(out1["y"], want) and np.array_equal(out2["y"], want)


@pytest.mark.parametrize("cheater", ["h1", "h2"])
@pytest.mark.parametrize("index", [0, 333])
def test_a_party_that_lies_in_the_masks_openings_is_caught(garble_pair, cheater, index):
    """An opened bit of d = l_u ^ a or e = l_v ^ b (which would set l_u l_v wrong, and so the
    gate's output) flipped by either party: the deferred check fails before any output."""
    pair = garble_pair()
    getattr(pair, cheater)._deviate_for_test("flip_opening", index)
    if cheater == "h1":
        err = cheat(pair, adder(), {"x": XS}, {"y": YS})
    else:
        side = Background(lambda: pair.h2.run(adder(), {"y": YS}, {}, None))
        with pytest.raises(PeerDeviated) as caught:
            pair.h1.run(adder(), {"x": XS}, {}, None)
        pair.h1_channel.close()
        with pytest.raises((ChannelError, PeerDeviated)):
            side.result()
        err = caught.value
    assert "AND-gate openings" in str(err)


@pytest.mark.parametrize("cheater", ["h1", "h2"])
def test_a_party_that_flips_an_output_share_is_caught(garble_pair, cheater):
    """H1's share is its mask bit l_A (MAC under H2's key); H2's is z ^ l_B, whose MAC is its
    label: flipping it needs the other label, that is Delta_A."""
    pair = garble_pair()
    getattr(pair, cheater)._deviate_for_test("flip_output", 17)
    if cheater == "h1":
        err = cheat(pair, adder(), {"x": XS}, {"y": YS}, cheater_gets_output=True)
    else:
        side = Background(lambda: pair.h2.run(adder(), {"y": YS}, {}, None))
        with pytest.raises(PeerDeviated) as caught:
            pair.h1.run(adder(), {"x": XS}, {}, None)
        side.result()  # the cheater learns the output (security with abort)
        err = caught.value
    assert "output shares" in str(err)


def test_a_party_that_lies_about_an_input_mask_is_caught(garble_pair):
    pair = garble_pair()
    pair.h1._deviate_for_test("flip_input_mask", 9)
    cheat(pair, adder(), {"x": XS}, {"y": YS})


@pytest.mark.parametrize("kind", ["half_and_flip", "correction_flip", "check_flip"])
def test_a_party_that_deviates_in_the_triples_is_caught(garble_pair, kind):
    pair = garble_pair()
    pair.h1._deviate_triples_for_test(kind, 11)
    err = cheat(pair, adder(), {"x": XS}, {"y": YS})
    assert "leaky AND" in str(err)


def test_honest_runs_beside_the_cheaters_pass(garble_pair):
    """The control of every cheater above: the same circuit and inputs, nobody deviating,
    twice in one session (fresh masks, labels and tweaks each run)."""
    pair = garble_pair()
    expected = adder().evaluate({"x": XS, "y": YS})
    for _ in range(2):
        out1, out2 = pair.run(adder(), {"x": XS}, {"y": YS})
        assert np.array_equal(out1["s"], expected["s"])
        assert np.array_equal(out2["p"], expected["p"])
        assert "p" not in out1
