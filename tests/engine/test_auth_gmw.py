"""Authenticated GMW (auth_gmw.h, layer 3a of docs/MALICIOUS.md): the two servers run the same
circuit descriptions as every backend and get the plaintext evaluator's outputs (the run
interface's tests, gadgets, random circuits, small and empty batches, reveal kinds, keep and
carry, run on both GMW parties in test_gmw.py; here the sampler's circuit), and a server
that deviates anywhere (an opened value, a wire, an output share, an input mask, the leaky AND
triples) is caught with PeerDeviated before any output computed from its messages is revealed.

Each cheater is a real party with valid keys, made to deviate at a named point; each has an
honest control beside it (the same run without the deviation, or the deviation with the honest
party's true Delta handed to the cheater, which only a MAC can stop) so that no check here is
one that cannot fail.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest
from helpers import Background
from test_gmw import GmwPair, gmw_pair

from garbled_core import (
    AuthGmwParty,
    Channel,
    ChannelError,
    CircuitBuilder,
    GmwParty,
    Listener,
    PeerDeviated,
    ProtocolError,
)
from garbled_core.discrete_gaussian import build_trial_circuit, derive_params

__all__ = ["gmw_pair"]  # test_gmw's fixture, used here


@pytest.fixture
def auth_pair():
    """H1 and H2 authenticated GMW parties over loopback (test_gmw's pairs), on the TEST-ONLY
    silent OT and making each run's triples as it needs them unless ``ot`` / ``triple_batch``
    say otherwise; closed after the test."""
    made: list[GmwPair] = []

    def make(ot: str = "silent-test-only", triple_batch: int = 0, **kw: Any) -> GmwPair:
        made.append(
            GmwPair(
                make_party=lambda ch, role: AuthGmwParty(
                    ch, role, ot=ot, triple_batch=triple_batch, **kw
                )
            )
        )
        return made[-1]

    yield make
    for pair in made:
        pair.close()


def setup_both(pair: GmwPair) -> None:
    side = Background(pair.h1.setup)
    pair.h2.setup()
    side.result()


# ---------------------------------------------------------------- the outputs are right


def check_trial_circuit(pair: GmwPair, n: int = 24, seed: int = 5) -> Any:
    """The noise's own circuit (the ripple build) on ``pair``, random inputs: the accept bits
    and the noise equal the plaintext evaluator's on both sides. Returns the circuit."""
    params = derive_params(64.0)
    circuit = build_trial_circuit(params, z_reveal="both")
    rng = np.random.default_rng(seed)
    h1_inputs, h2_inputs = {}, {}
    for name, owner, width in circuit.inputs:
        values = rng.integers(0, 1 << width, n, dtype=np.uint64)
        (h1_inputs if owner == "garbler" else h2_inputs)[name] = values
    expected = circuit.evaluate({**h1_inputs, **h2_inputs})
    out1, out2 = pair.run(circuit, h1_inputs, h2_inputs)
    for name in ("accept", "z"):
        assert np.array_equal(out1[name], expected[name]), name
        assert np.array_equal(out2[name], expected[name]), name
    return circuit


def test_trial_circuit_of_the_sampler(auth_pair):
    """The noise's own circuit: the accept bits and the noise equal the plaintext evaluator's."""
    pair = auth_pair()
    circuit = check_trial_circuit(pair)
    n = 24
    assert pair.h1.last_bucket_size == pair.h2.last_bucket_size >= 3
    assert pair.h1.leaky_triples_made == pair.h1.last_bucket_size * circuit.and_count * n


def test_triples_come_from_a_stock_made_a_batch_at_a_time(auth_pair):
    """triple_batch: the first run makes a whole batch (one bucketing over it: bucket size 3
    from about 553,000 triples at 2^-42), and later runs take theirs from the stock without
    making any."""
    pair = auth_pair(triple_batch=600_000)
    circuit = adder()
    per_run = circuit.and_count * len(XS)
    pair.run(circuit, {"x": XS}, {"y": YS})
    assert pair.h1.last_bucket_size == pair.h2.last_bucket_size == 3
    made = pair.h1.leaky_triples_made
    assert made == 3 * 600_000
    assert pair.h1.triples_in_stock == pair.h2.triples_in_stock == 600_000 - per_run
    out1, out2 = pair.run(circuit, {"x": XS}, {"y": YS})
    assert pair.h1.leaky_triples_made == made  # none made: taken from the stock
    assert pair.h1.triples_in_stock == 600_000 - 2 * per_run
    expected = circuit.evaluate({"x": XS, "y": YS})
    assert np.array_equal(out1["s"], expected["s"]) and np.array_equal(out2["p"], expected["p"])


def test_kept_values_do_not_cross_sessions(auth_pair):
    b1 = CircuitBuilder("keep")
    b1.output("v", b1.input("x", owner="garbler", width=8), reveal="keep")
    keep = b1.build()
    b2 = CircuitBuilder("use")
    b2.output("v", b2.input("v", owner="carried", width=8), reveal="both")
    use = b2.build()
    first, second = auth_pair(), auth_pair()
    xs = np.arange(5, dtype=np.uint64)
    g, _ = first.run(keep, {"x": xs}, n=5)
    setup_both(second)
    with pytest.raises(ValueError, match="not kept by this authenticated GMW party"):
        second.h1.run(use, {}, {"v": g["v"]})


def test_a_semi_honest_peer_is_refused_at_setup(auth_pair):
    pair = auth_pair()
    plain = GmwParty(pair.h2_channel, "evaluator")
    side = Background(pair.h1.setup)
    with pytest.raises(ProtocolError):
        plain.setup()
    with pytest.raises(ProtocolError, match="security mismatch"):
        side.result()


# ---------------------------------------------------------------- the cheaters


def cheat(pair: GmwPair, circuit, h1_inputs, h2_inputs, cheater_gets_output=False) -> PeerDeviated:
    """H1 deviates (already set up to); H2 must refuse with PeerDeviated. H1 gets no output
    either (H2 stops the run), except when it cheats in the output shares themselves: both send
    those at once, so a cheater there learns the output and only the honest party aborts
    (security with abort; what H2 keeps is its evidence). Returns H2's error."""
    side = Background(lambda: pair.h1.run(circuit, h1_inputs, {}, None))
    with pytest.raises(PeerDeviated) as caught:
        pair.h2.run(circuit, h2_inputs, {}, None)
    pair.h2_channel.close()
    if cheater_gets_output:
        side.result()
    else:
        with pytest.raises((ChannelError, PeerDeviated)):
            side.result()
    assert len(pair.h2.evidence_digest) == 64
    return caught.value


def adder():
    b = CircuitBuilder("adder")
    x = b.input("x", owner="garbler", width=16)
    y = b.input("y", owner="evaluator", width=16)
    b.output("s", b.add(x, y), reveal="both")
    b.output("p", b.and_(x, y), reveal="evaluator")
    return b.build()


XS = np.arange(40, dtype=np.uint64) * np.uint64(1013)
YS = np.arange(40, dtype=np.uint64) * np.uint64(7)


@pytest.mark.parametrize("index", [0, 1, 333, 599])
def test_a_party_that_adds_a_constant_to_an_opened_value_is_caught(auth_pair, index):
    pair = auth_pair()
    pair.h1._deviate_for_test("flip_opening", index)
    err = cheat(pair, adder(), {"x": XS}, {"y": YS})
    assert "AND-gate openings" in str(err)


def test_a_flipped_opening_with_a_guessed_mac_offset_is_caught(auth_pair):
    pair = auth_pair()
    guess = bytearray(secrets.token_bytes(16))
    guess[0] |= 1
    pair.h1._deviate_for_test("flip_opening", 5, bytes(guess))
    cheat(pair, adder(), {"x": XS}, {"y": YS})


def test_control_a_flipped_opening_with_the_true_delta_passes(auth_pair):
    """Handed the honest party's Delta, the same cheater is accepted (no PeerDeviated): the
    MAC, and nothing else, is what stops it."""
    pair = auth_pair()
    setup_both(pair)
    pair.h1._deviate_for_test("flip_opening", 5, pair.h2._delta_for_test())
    out1, out2 = pair.run(adder(), {"x": XS}, {"y": YS})
    assert np.array_equal(out1["s"], out2["s"])


def test_a_party_that_adds_a_constant_to_a_wire_is_caught(auth_pair):
    pair = auth_pair()
    pair.h1._deviate_for_test("flip_wire", 3)
    cheat(pair, adder(), {"x": XS}, {"y": YS})


def test_a_party_that_flips_an_output_share_is_caught(auth_pair):
    pair = auth_pair()
    pair.h1._deviate_for_test("flip_output", 17)
    err = cheat(pair, adder(), {"x": XS}, {"y": YS}, cheater_gets_output=True)
    assert "output shares" in str(err)


def test_a_party_that_lies_about_an_input_mask_is_caught(auth_pair):
    """H1 opens a wrong bit of its mask for one of H2's inputs (to shift H2's input)."""
    pair = auth_pair()
    pair.h1._deviate_for_test("flip_input_mask", 9)
    cheat(pair, adder(), {"x": XS}, {"y": YS})


def noisy_sum(leave_out_peer_noise: bool = False):
    """The round's shape in miniature: y = s1 + s2 + (r1 xor r2), each server's share of the
    sum and its noise bits. ``leave_out_peer_noise``: the cheater's version, which adds only
    its own r1 (which it may set to zero), with the same AND gates and one XOR fewer."""
    b = CircuitBuilder("noisy-sum")
    s1 = b.input("s1", owner="garbler", width=16)
    r1 = b.input("r1", owner="garbler", width=16)
    s2 = b.input("s2", owner="evaluator", width=16)
    r2 = b.input("r2", owner="evaluator", width=16)
    noise = r1 if leave_out_peer_noise else b.xor(r1, r2)
    b.output("y", b.add(b.add(s1, s2), noise), reveal="both")
    return b.build()


NOISY_SUM_H1 = {"s1": XS, "r1": np.zeros(40, dtype=np.uint64)}  # the cheater's "noise": none
NOISY_SUM_H2 = {"s2": YS, "r2": np.arange(40, dtype=np.uint64) * np.uint64(1_607) + 1}


def run_under_the_agreed_name(pair: GmwPair, real, cheats: bool) -> tuple[Any, Any]:
    """H1 states ``real``'s hash in its run header and evaluates the noise-free circuit
    (``cheats``) or ``real`` itself; H2 runs ``real``. (H1's side, H2's side) as Background
    results: H2's, or the error it raised."""
    pair.h1._claim_circuit_for_test(real.hash)
    run_by_h1 = noisy_sum(leave_out_peer_noise=True) if cheats else real
    assert run_by_h1.and_count == real.and_count and (run_by_h1.hash != real.hash) == cheats
    side = Background(lambda: pair.h1.run(run_by_h1, NOISY_SUM_H1, {}, None))
    mine = Background(lambda: pair.h2.run(real, NOISY_SUM_H2, {}, None))
    return side, mine


def test_a_party_that_runs_the_circuit_without_the_peers_noise_is_caught(auth_pair):
    """Issue 46's "garbles the circuit without noise", on GMW: H1 states the agreed circuit's
    hash and evaluates one that leaves H2's noise out. Its shares of the sum's wires follow the
    other circuit, their MACs cannot (the keys follow H2's evaluation of the agreed one): H2's
    deferred check fails before any output is sent."""
    pair = auth_pair()
    side, mine = run_under_the_agreed_name(pair, noisy_sum(), cheats=True)
    with pytest.raises(PeerDeviated, match="AND-gate openings"):
        mine.result()
    pair.h2_channel.close()
    with pytest.raises((ChannelError, PeerDeviated)):
        side.result()  # H1 learns nothing either: H2 stopped before the outputs


def test_control_the_claim_alone_passes_and_semi_honest_gmw_misses_the_other_circuit(
    auth_pair, gmw_pair
):
    """The controls: the hook itself (H1 states the agreed hash and runs the agreed circuit)
    is accepted with the right outputs; and semi-honest GMW runs H1's other circuit to its end
    without noticing, releasing a wrong y, which only the MACs above stop."""
    real = noisy_sum()
    want = real.evaluate({**NOISY_SUM_H1, **NOISY_SUM_H2})["y"]
    pair = auth_pair()
    side, mine = run_under_the_agreed_name(pair, real, cheats=False)
    assert np.array_equal(mine.result()["y"], want) and np.array_equal(side.result()["y"], want)
    plain = gmw_pair()
    side, mine = run_under_the_agreed_name(plain, real, cheats=True)
    y2, y1 = mine.result()["y"], side.result()["y"]
    assert np.array_equal(y1, y2) and not np.array_equal(y2, want)


@pytest.mark.parametrize("kind", ["half_and_flip", "correction_flip", "check_flip"])
def test_a_party_that_deviates_in_the_triples_is_caught(auth_pair, kind):
    """(A wrong U is caught exactly when it bets wrong on the honest x bit:
    test_auth_triples.py checks that against the honest party's bits.)"""
    pair = auth_pair()
    pair.h1._deviate_triples_for_test(kind, 11)
    err = cheat(pair, adder(), {"x": XS}, {"y": YS})
    assert "leaky AND" in str(err)


def test_honest_runs_beside_the_cheaters_pass(auth_pair):
    """The control of every cheater above: the same circuit and inputs, nobody deviating."""
    pair = auth_pair()
    out1, out2 = pair.run(adder(), {"x": XS}, {"y": YS})
    expected = adder().evaluate({"x": XS, "y": YS})
    assert np.array_equal(out1["s"], expected["s"])
    assert np.array_equal(out2["p"], expected["p"])


def test_bad_arguments():
    listener = Listener("127.0.0.1", 0)
    try:
        accepting = Background(lambda: listener.accept(timeout=10, insecure=True))
        ch = Channel.connect("127.0.0.1", listener.port, timeout=10, insecure=True)
        other = accepting.result()
        with pytest.raises(ValueError, match="role"):
            AuthGmwParty(ch, "h3")
        with pytest.raises(ValueError, match="rho"):
            AuthGmwParty(ch, "garbler", rho=0)
        with pytest.raises(ValueError, match="ot must be"):
            AuthGmwParty(ch, "garbler", ot="ferret")
        ch.close()
        other.close()
    finally:
        listener.close()


@pytest.mark.parametrize("ot", ["silent", "iknp"])
def test_each_cot_source_gives_the_plaintext_outputs(auth_pair, ot):
    """Ferret's real set with its malicious check (the default), and checked IKNP."""
    pair = auth_pair(ot=ot)
    out1, out2 = pair.run(adder(), {"x": XS}, {"y": YS})
    expected = adder().evaluate({"x": XS, "y": YS})
    assert np.array_equal(out1["s"], expected["s"])
    assert np.array_equal(out2["p"], expected["p"])


@pytest.mark.parametrize(
    ("h1", "h2", "message"),
    [
        ({"ot": "iknp"}, {"ot": "silent-test-only"}, "COT source mismatch"),
        ({"triple_batch": 0}, {"triple_batch": 1000}, "triple batch mismatch"),
    ],
)
def test_the_parties_must_agree_on_their_cot_source_and_triple_batch(h1, h2, message):
    base = {"ot": "silent-test-only"}
    kw = {"garbler": {**base, **h1}, "evaluator": {**base, **h2}}
    pair = GmwPair(make_party=lambda ch, role: AuthGmwParty(ch, role, **kw[role]))
    side = Background(pair.h1.setup)
    with pytest.raises(ProtocolError, match=message):
        pair.h2.setup()
    with pytest.raises(ProtocolError, match=message):
        side.result()
    pair.close()
