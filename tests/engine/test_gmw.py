"""The GMW backend runs the same circuit descriptions as the plaintext evaluator, the garbler
and the evaluator, and gets the same outputs.

Two GmwParty objects (H1 = role "garbler", H2 = role "evaluator") talk over a loopback
Channel, one of them in a background thread (the engine releases the GIL).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import pytest
from helpers import Background
from test_engine import all_pairs, edge_and_random, gadget_circuit, random_circuit

from garbled_core import (
    DEFAULT_OT_K,
    AuthGarbleParty,
    AuthGmwParty,
    AuthSession,
    Channel,
    ChannelError,
    CircuitBuilder,
    Evaluator,
    Garbler,
    GmwParty,
    Listener,
    ProtocolError,
    _core,
)
from garbled_core.discrete_gaussian import build_trial_circuit, derive_params

# GMW's messages, from gmw.h / gmw.cpp: hello 20 bytes each way; party 0 then sends the
# session id, hash salt and input-mask seed (40 bytes); per run a 88-byte header each way and
# an 8-byte end-of-run tag after the output shares.
HELLO, SEEDS, HEADER, END_TAG = 20, 40, 88, 8
P256_POINT = 33  # a compressed point of the Chou-Orlandi base OT


class GmwPair:
    """H1 and H2 GMW parties linked over loopback; ``make_party(channel, role)`` makes another
    kind (authenticated GMW, test_auth_gmw.py)."""

    def __init__(self, ot_k: int = DEFAULT_OT_K, make_party: Any = None) -> None:
        listener = Listener("127.0.0.1", 0)
        accepting = Background(lambda: listener.accept(timeout=10, insecure=True))
        self.h2_channel = Channel.connect("127.0.0.1", listener.port, timeout=10, insecure=True)
        self.h1_channel = accepting.result()
        listener.close()
        make = make_party or (lambda ch, role: GmwParty(ch, role, ot_k=ot_k))
        self.h1 = make(self.h1_channel, "garbler")
        self.h2 = make(self.h2_channel, "evaluator")

    def run(
        self,
        circuit: Any,
        h1_inputs: dict | None = None,
        h2_inputs: dict | None = None,
        h1_carried: dict | None = None,
        h2_carried: dict | None = None,
        n: int | None = None,
    ) -> tuple[dict, dict]:
        side = Background(lambda: self.h1.run(circuit, h1_inputs or {}, h1_carried or {}, n))
        out2 = self.h2.run(circuit, h2_inputs or {}, h2_carried or {}, n)
        return side.result(), out2

    def close(self) -> None:
        self.h1_channel.close()
        self.h2_channel.close()


@pytest.fixture
def gmw_pair():
    made: list[GmwPair] = []

    def make(**kw: Any) -> GmwPair:
        pair = GmwPair(**kw)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.close()


# The run interface's tests below run on both GMW parties, semi-honest and authenticated
# (AuthGmwParty, security: malicious; its own tests in test_auth_gmw.py), and on authenticated
# garbling (AuthGarbleParty, its own tests in test_auth_garble.py), on TEST-ONLY silent OT.
KINDS = ("gmw", "authenticated", "authenticated-garbling")
AUTH_KINDS = {"authenticated": AuthGmwParty, "authenticated-garbling": AuthGarbleParty}


def heard(party: Any) -> Any:
    """A digest of what the peer sent in the last run (each kind keeps one)."""
    return party.evidence_digest if isinstance(party, AuthSession) else party.last_transcript


def pair_of(gmw_pair, kind: str) -> GmwPair:
    if kind == "gmw":
        return gmw_pair()
    kind_class = AUTH_KINDS[kind]
    return gmw_pair(
        make_party=lambda ch, role: kind_class(ch, role, ot="silent-test-only", triple_batch=0)
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", [1, 8, 32, 64])
def test_every_gadget_equals_plaintext(gmw_pair, width, kind):
    circuit = gadget_circuit(width)
    xs, ys = all_pairs(edge_and_random(14, width, 1), edge_and_random(14, width, 2))
    expected = circuit.evaluate({"x": xs, "y": ys})
    pair = pair_of(gmw_pair, kind)
    out1, out2 = pair.run(circuit, {"x": xs}, {"y": ys})
    for name, values in expected.items():
        assert np.array_equal(out1[name], values), name
        assert np.array_equal(out2[name], values), name
    # One exchange each way per AND layer: the circuit's AND-depth, at most its AND count.
    assert 1 <= pair.h1.last_layers == pair.h2.last_layers <= circuit.and_count


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_circuits(gmw_pair, seed, kind):
    circuit = random_circuit(seed)
    assert circuit.and_count > 50
    rng = np.random.default_rng(seed)
    n = 1000 + seed * 37  # not a multiple of 8 or 64
    g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
    e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
    expected = circuit.evaluate({"g": g, "e": e})
    out1, out2 = pair_of(gmw_pair, kind).run(circuit, {"g": g}, {"e": e})
    assert np.array_equal(out1["out"], expected["out"])
    assert np.array_equal(out2["out"], expected["out"])
    assert np.array_equal(out2["mid"], expected["mid"])
    assert "mid" not in out1  # revealed to H2 (the "evaluator" role) only


@pytest.mark.parametrize("kind", KINDS)
def test_small_and_empty_batches(gmw_pair, kind):
    circuit = random_circuit(4, gates=120)
    pair = pair_of(gmw_pair, kind)
    for n in (1, 7, 64, 65, 0):
        rng = np.random.default_rng(n)
        g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
        e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
        expected = circuit.evaluate({"g": g, "e": e}, n=n)
        out1, out2 = pair.run(circuit, {"g": g}, {"e": e}, n=n)
        assert np.array_equal(out1["out"], expected["out"]), n
        assert np.array_equal(out2["mid"], expected["mid"]), n
    assert pair.h1.runs == pair.h2.runs == 5


def test_trial_circuit_of_the_sampler(gmw_pair):
    params = derive_params(64.0)
    circuit = build_trial_circuit(params, z_reveal="both")
    assert circuit.and_count > 300
    rng = np.random.default_rng(5)
    n = 300
    h1_inputs, h2_inputs = {}, {}
    for name, owner, width in circuit.inputs:
        values = rng.integers(0, 1 << width, n, dtype=np.uint64)
        (h1_inputs if owner == "garbler" else h2_inputs)[name] = values
    expected = circuit.evaluate({**h1_inputs, **h2_inputs})
    pair = gmw_pair()
    out1, out2 = pair.run(circuit, h1_inputs, h2_inputs)
    for name in ("accept", "z"):
        assert np.array_equal(out1[name], expected[name]), name
        assert np.array_equal(out2[name], expected[name]), name
    assert 0 < expected["accept"].sum() < n  # both branches of the sampler exercised
    assert pair.h1.last_layers > 10  # ripple-carry arithmetic: many AND layers


def reveal_circuit():
    b = CircuitBuilder("reveal")
    x = b.input("x", owner="garbler", width=16)
    y = b.input("y", owner="evaluator", width=16)
    s = b.add(x, y)
    b.output("both", s, reveal="both")
    b.output("to_garbler", b.xor(x, y), reveal="garbler")
    b.output("to_evaluator", b.sub(x, y), reveal="evaluator")
    b.output("shared", s, reveal="shares")
    b.output("shared_input", x, reveal="shares")
    return b.build()


@pytest.mark.parametrize("kind", KINDS)
def test_reveal_modes_and_fresh_triples_per_run(gmw_pair, kind):
    circuit = reveal_circuit()
    rng = np.random.default_rng(7)
    xs = rng.integers(0, 1 << 16, 3001, dtype=np.uint64)
    ys = rng.integers(0, 1 << 16, 3001, dtype=np.uint64)
    expected = circuit.evaluate({"x": xs, "y": ys})
    pair = pair_of(gmw_pair, kind)
    out1, out2 = pair.run(circuit, {"x": xs}, {"y": ys})
    assert sorted(out1) == ["both", "shared", "shared_input", "to_garbler"]
    assert sorted(out2) == ["both", "shared", "shared_input", "to_evaluator"]
    assert np.array_equal(out1["both"], expected["both"])
    assert np.array_equal(out2["both"], expected["both"])
    assert np.array_equal(out1["to_garbler"], expected["to_garbler"])
    assert np.array_equal(out2["to_evaluator"], expected["to_evaluator"])
    for name in ("shared", "shared_input"):
        assert np.array_equal(out1[name] ^ out2[name], expected[name]), name
        # A share alone is masked: an input's share too (the mask stream, not zero).
        assert not np.array_equal(out1[name], expected[name]), name
        assert not np.array_equal(out2[name], np.zeros_like(out2[name])), name
    first = (heard(pair.h1), heard(pair.h2), out1["shared"].copy())

    # The same inputs again: same outputs, but new triples, so new openings and new shares.
    again1, again2 = pair.run(circuit, {"x": xs}, {"y": ys})
    assert np.array_equal(again1["both"], expected["both"])
    assert np.array_equal(again1["shared"] ^ again2["shared"], expected["shared"])
    assert heard(pair.h1) != first[0]
    assert heard(pair.h2) != first[1]
    assert not np.array_equal(again1["shared"], first[2])


@pytest.mark.parametrize("kind", KINDS)
def test_keep_then_carry_selected_instances(gmw_pair, kind):
    """Stage 1 reveals an accept bit and keeps a value as shares; stage 2 continues from the
    accepted instances only (the noise sampler's pattern)."""
    b1 = CircuitBuilder("stage1")
    x = b1.input("x", owner="garbler", width=24)
    y = b1.input("y", owner="evaluator", width=24)
    total = b1.add(x, y)
    b1.output("accept", total[0], reveal="both")
    b1.output("total", total, reveal="keep")
    stage1 = b1.build()
    b2 = CircuitBuilder("stage2")
    t = b2.input("total", owner="carried", width=24)
    z = b2.input("z", owner="evaluator", width=24)
    b2.output("result", b2.add(b2.mul_const(t, 3, 24), z))
    b2.output("again", t, reveal="keep")
    stage2 = b2.build()
    b3 = CircuitBuilder("stage3")
    b3.output("t", b3.input("t", owner="carried", width=24), reveal="both")
    stage3 = b3.build()

    rng = np.random.default_rng(11)
    n = 2000
    xs = rng.integers(0, 1 << 24, n, dtype=np.uint64)
    ys = rng.integers(0, 1 << 24, n, dtype=np.uint64)
    pair = pair_of(gmw_pair, kind)
    g1, e1 = pair.run(stage1, {"x": xs}, {"y": ys})
    assert np.array_equal(g1["accept"], e1["accept"])
    assert g1["total"].n == n and g1["total"].width == 24
    accepted = np.flatnonzero(e1["accept"]).astype(np.uint64)
    chosen = accepted[::-1].copy()  # any order, not only increasing
    zs = rng.integers(0, 1 << 24, len(chosen), dtype=np.uint64)
    g2, e2 = pair.run(
        stage2,
        h2_inputs={"z": zs},
        h1_carried={"total": g1["total"].select(chosen)},
        h2_carried={"total": e1["total"].select(chosen)},
    )
    totals = (xs + ys) & np.uint64((1 << 24) - 1)
    want = (totals[chosen] * np.uint64(3) + zs) & np.uint64((1 << 24) - 1)
    assert np.array_equal(e2["result"], want)
    assert np.array_equal(g2["result"], want)
    # A Kept of a run that itself carried (a whole Kept, no selection) chains on.
    g3, e3 = pair.run(stage3, h1_carried={"t": g2["again"]}, h2_carried={"t": e2["again"]})
    assert np.array_equal(g3["t"], totals[chosen])
    assert np.array_equal(e3["t"], totals[chosen])


def test_kept_values_do_not_cross_backends(gmw_pair, two_party):
    b1 = CircuitBuilder("keep")
    b1.output("v", b1.input("x", owner="garbler", width=8), reveal="keep")
    keep = b1.build()
    b2 = CircuitBuilder("use")
    b2.output("v", b2.input("v", owner="carried", width=8))
    use = b2.build()
    xs = np.arange(100, dtype=np.uint64)
    gc_pair = two_party()
    gc_g, gc_e = gc_pair.run(keep, {"x": xs}, n=100)
    gmw = gmw_pair()
    gmw_1, gmw_2 = gmw.run(keep, {"x": xs}, n=100)
    # Refused before anything is sent, on each side, so both links stay usable.
    with pytest.raises(ValueError, match="not kept by this GMW party"):
        gmw.h1.run(use, {}, {"v": gc_g["v"]})
    with pytest.raises(ValueError, match="not kept by this GMW party"):
        gmw.h2.run(use, {}, {"v": gc_e["v"].select(np.arange(10, dtype=np.uint64))})
    with pytest.raises(ValueError, match="another session"):
        gc_pair.garbler.run(use, {}, {"v": gmw_1["v"]})
    with pytest.raises(ValueError, match="another session"):
        gc_pair.evaluator.run(use, {}, {"v": gmw_2["v"]})
    out1, out2 = gmw.run(use, h1_carried={"v": gmw_1["v"]}, h2_carried={"v": gmw_2["v"]})
    assert np.array_equal(out1["v"], xs) and np.array_equal(out2["v"], xs)
    out_g, out_e = gc_pair.run(
        use, garbler_carried={"v": gc_g["v"]}, evaluator_carried={"v": gc_e["v"]}
    )
    assert np.array_equal(out_g["v"], xs) and np.array_equal(out_e["v"], xs)


def add_sub_circuits():
    b1 = CircuitBuilder("one")
    b1.output(
        "y",
        b1.add(b1.input("x", owner="garbler", width=8), b1.input("y", owner="evaluator", width=8)),
    )
    b2 = CircuitBuilder("two")
    b2.output(
        "y",
        b2.sub(b2.input("x", owner="garbler", width=8), b2.input("y", owner="evaluator", width=8)),
    )
    return b1.build(), b2.build()


def test_circuit_mismatch_fails_on_both_sides(gmw_pair):
    c1, c2 = add_sub_circuits()
    pair = gmw_pair()
    xs = np.arange(10, dtype=np.uint64)
    side = Background(lambda: pair.h1.run(c1, {"x": xs}))
    with pytest.raises(ProtocolError, match="circuit mismatch"):
        pair.h2.run(c2, {"y": xs})
    with pytest.raises(ProtocolError, match="circuit mismatch"):
        side.result()
    # The failed run leaves the link out of step: later runs are refused, not misread.
    with pytest.raises(ProtocolError, match="out of step"):
        pair.h2.run(c1, {"y": xs})


def test_instance_count_and_role_mismatch(gmw_pair):
    c1, _ = add_sub_circuits()
    pair = gmw_pair()
    side = Background(lambda: pair.h1.run(c1, {"x": np.arange(10, dtype=np.uint64)}))
    with pytest.raises(ProtocolError, match="instance count mismatch"):
        pair.h2.run(c1, {"y": np.arange(11, dtype=np.uint64)})
    with pytest.raises(ProtocolError, match="instance count mismatch"):
        side.result()
    listener = Listener("127.0.0.1", 0)
    accepting = Background(lambda: listener.accept(timeout=10, insecure=True))
    a = Channel.connect("127.0.0.1", listener.port, timeout=10, insecure=True)
    b = accepting.result()
    listener.close()
    try:
        side = Background(lambda: GmwParty(a, "garbler").setup())
        with pytest.raises(ProtocolError, match="both parties are GMW party 0"):
            GmwParty(b, "garbler").setup()
        with pytest.raises(ProtocolError, match="both parties are GMW party 0"):
            side.result()
    finally:
        a.close()
        b.close()


def test_garbled_circuit_peer_is_refused_at_setup(gmw_pair):
    pair = gmw_pair()
    side = Background(lambda: Evaluator(pair.h2_channel).setup())
    with pytest.raises(ProtocolError, match="backend mismatch"):
        pair.h1.setup()
    with pytest.raises(ProtocolError, match="not an SPGC garbled-circuit garbler"):
        side.result()


def honest_header(circuit, n: int, run_id: int = 0) -> bytes:
    """H2's run header as gmw.cpp writes it (no carried inputs)."""
    return struct.pack(
        "<4sIIIQ32s32s",
        b"GMWH",
        1,
        run_id,
        0,
        n,
        bytes.fromhex(circuit.hash),
        hashlib.sha256(b"").digest(),
    )


def test_peer_closing_mid_run_is_a_clean_error(gmw_pair):
    """H2 completes setup and a valid run header, sends part of its triple stream, then
    closes: H1 fails with a ChannelError, it never returns outputs."""
    c1, _ = add_sub_circuits()
    assert len(honest_header(c1, 1000)) == HEADER
    pair = gmw_pair()
    side = Background(pair.h2.setup)
    pair.h1.setup()
    side.result()
    xs = np.arange(1000, dtype=np.uint64) & np.uint64(255)
    honest = Background(lambda: pair.h1.run(c1, {"x": xs}))
    pair.h2_channel.send(honest_header(c1, 1000))
    assert pair.h2_channel.recv(HEADER)[:4] == b"GMWH"  # H1 accepted and sent its own
    pair.h2_channel.send(b"\x00" * 100)  # a short piece of the triple stream
    pair.h2_channel.close()
    with pytest.raises(ChannelError):
        honest.result()


def test_garbage_header_is_a_protocol_error(gmw_pair):
    c1, _ = add_sub_circuits()
    pair = gmw_pair()
    side = Background(pair.h2.setup)
    pair.h1.setup()
    side.result()
    honest = Background(lambda: pair.h1.run(c1, {"x": np.arange(5, dtype=np.uint64)}))
    pair.h2_channel.send(b"\xff" * HEADER)
    pair.h2_channel.flush()
    with pytest.raises(ProtocolError, match="not a GMW header"):
        honest.result()


def test_triples_from_random_ot_are_correct_and_fresh(gmw_pair):
    """The triple generator alone, through the SoftSpoken ROT source: c0 ^ c1 = (a0 ^ a1) &
    (b0 ^ b1) for every triple, each share looks uniform, and every batch is new. 2.2 M triples
    take three steps of 2^20 (the sender half of a step runs one step behind its receiver
    half)."""
    counts = [1, 5000, 5000, 2_200_000]
    pair = gmw_pair()
    side = Background(lambda: _core._gmw_triples(pair.h1_channel, 0, counts))
    mine = _core._gmw_triples(pair.h2_channel, 1, counts)
    theirs = side.result()

    def bits(words: np.ndarray, count: int) -> np.ndarray:
        return np.unpackbits(words.view(np.uint8), bitorder="little")[:count]

    seen = []
    for count, t0, t1 in zip(counts, theirs, mine, strict=True):
        a0, b0, c0 = (bits(w, count) for w in t0)
        a1, b1, c1 = (bits(w, count) for w in t1)
        assert np.array_equal(c0 ^ c1, (a0 ^ a1) & (b0 ^ b1)), count
        if count >= 5000:
            for share in (a0, b0, c0, a1, b1, c1):
                assert abs(share.mean() - 0.5) < 0.05, count
            seen.append(np.concatenate([a0[:5000], b0[:5000], c0[:5000]]))
    for i in range(len(seen)):
        for j in range(i):
            assert not np.array_equal(seen[i], seen[j])  # never the same triples twice


def test_group_triples_share_a_and_are_correct(gmw_pair):
    """Group triples (AND gates sharing an input): per group and instance one a bit and, per
    member, b and c with c0 ^ c1 = (a0 ^ a1) & (b0 ^ b1), from one random OT each way per
    group and instance whatever its width (1 to 128 bits of the hashed OT string). Counts
    that are not multiples of 64 put a group's rows across OT batches at odd bit offsets."""
    widths = [1, 3, 128, 64, 1]
    counts = [777, 70_001]
    pair = gmw_pair()
    side = Background(lambda: _core._gmw_triples(pair.h1_channel, 0, counts, widths=widths))
    mine = _core._gmw_triples(pair.h2_channel, 1, counts, widths=widths)
    theirs = side.result()

    def bits(rows: np.ndarray, count: int) -> np.ndarray:
        return np.unpackbits(rows.view(np.uint8), axis=1, bitorder="little")[:, :count]

    for count, t0, t1 in zip(counts, theirs, mine, strict=True):
        a0, b0, c0 = (bits(r, count) for r in t0)
        a1, b1, c1 = (bits(r, count) for r in t1)
        assert a0.shape == (len(widths), count) and b0.shape == (sum(widths), count)
        group_of = np.repeat(np.arange(len(widths)), widths)
        a = (a0 ^ a1)[group_of]  # each member's a is its group's
        assert np.array_equal(c0 ^ c1, a & (b0 ^ b1))
        for share in (a0, b0, c0, a1, b1, c1):
            assert abs(share.mean() - 0.5) < 0.05
        # Members' b are independent: no two rows alike.
        b = b0 ^ b1
        assert len({row.tobytes() for row in b}) == len(b)
    with pytest.raises(ValueError, match=r"widths must be in 1\.\.128"):
        _core._gmw_triples(pair.h1_channel, 0, [1], widths=[129])


def test_bytes_per_and_gate(gmw_pair):
    """Exact bytes per phase, and the figure per AND gate per instance.

    AND gates of a layer that share an input form a group (the mux's 32 gates share its
    select). Online (phase "tables"): each party sends its share of d = key ^ a once per group
    and of e = y ^ b per gate: (groups + ANDs) bits per instance. Triples (phase
    "ot_extension"): one random OT each way per group and instance, whatever the group's width,
    so each party receives one ROT per group per instance and sends its SoftSpoken corrections
    for it: ceil(128 / k) - 1 chunks, i.e. 18 bits at k = 7 (the first chunk is free with random
    choices). Without groups that was 2 + 18 = 20 bits = 2.5 bytes per AND per instance.
    """
    b = CircuitBuilder("bytes")
    a = b.input("a", owner="garbler", width=32)
    x = b.input("b", owner="evaluator", width=32)
    d = b.sub(a, x)
    b.output("y", b.mux(b.lt_signed(d, a), d, a), reveal="both")
    b.output("flag", b.eq(a, x), reveal="garbler")
    b.output("s", d, reveal="shares")
    circuit = b.build()
    n = 1024  # n * AND count a multiple of 128: no padding of the last OT batch
    rng = np.random.default_rng(3)
    av = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    bv = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    pair = gmw_pair()
    out1, out2 = pair.run(circuit, {"a": av}, {"b": bv})
    plain = circuit.evaluate({"a": av, "b": bv})
    assert np.array_equal(out2["y"], plain["y"]) and np.array_equal(out1["flag"], plain["flag"])

    ands = circuit.and_count
    groups = pair.h1.last_groups
    assert groups == pair.h2.last_groups <= ands - 31  # the mux's 32 gates are one group
    chunks = -(-128 // DEFAULT_OT_K)
    ggm = 2 * (128 - chunks) * 16
    rots = -(-(groups * n) // 128) * 128
    rows = -(-n // 8)
    want = {
        "h1": {
            "setup": HELLO + SEEDS + HEADER,
            "base_ot": 128 * P256_POINT + P256_POINT + ggm,
            "ot_extension": (chunks - 1) * rots // 8,
            "tables": (groups + ands) * rows,
            "inputs": 0,
            "outputs": 32 * rows + END_TAG,  # y to H2
        },
        "h2": {
            "setup": HELLO + HEADER,
            "base_ot": 128 * P256_POINT + P256_POINT + ggm,
            "ot_extension": (chunks - 1) * rots // 8,
            "tables": (groups + ands) * rows,
            "inputs": 0,
            "outputs": (32 + 1) * rows + END_TAG,  # y and flag to H1
        },
    }
    got = {"h1": pair.h1_channel.counters(), "h2": pair.h2_channel.counters()}
    other = {"h1": "h2", "h2": "h1"}
    for who, phases in want.items():
        for phase, count in phases.items():
            assert got[who][phase]["sent"] == count, (who, phase)
            assert got[other[who]][phase]["received"] == count, (who, phase)
    per_and = (got["h1"]["tables"]["sent"] + got["h1"]["ot_extension"]["sent"]) / (ands * n)
    print(f"GMW bytes per AND gate per instance, per party sent (k={DEFAULT_OT_K}): {per_and}")
    assert per_and == ((groups + ands) + (chunks - 1) * groups) / (8 * ands) < 2.5
    assert pair.h1.ots_used == pair.h2.ots_used == rots
    # Round trips: one per AND layer, far fewer layers than AND gates.
    assert pair.h1.last_layers < ands


def silent_pair(gmw_pair) -> GmwPair:
    pair = gmw_pair()
    pair.h1 = GmwParty(pair.h1_channel, "garbler", ot="silent-test-only")
    pair.h2 = GmwParty(pair.h2_channel, "evaluator", ot="silent-test-only")
    return pair


def test_triples_from_silent_ot(gmw_pair):
    """The same backend on silent random OTs (Ferret's code, silent_ot.h, at its INSECURE test
    size): outputs equal the plaintext ones, runs get fresh triples, and after setup each party
    sends only the trees of the Ferret iterations its ROTs (one each way per AND group and
    instance) need, ceil(ROTs / usable) of them,
    17,408 bytes each at this size (Ferret's real set: 569,808 bytes per 9.6 M ROTs)."""
    circuit = random_circuit(2)
    pair = silent_pair(gmw_pair)
    side = Background(pair.h1.setup)
    pair.h2.setup()
    side.result()
    pair.h1_channel.reset_counters()
    pair.h2_channel.reset_counters()
    rng = np.random.default_rng(9)
    n = 2000
    g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
    e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
    expected = circuit.evaluate({"g": g, "e": e})
    out1, out2 = pair.run(circuit, {"g": g}, {"e": e})
    assert np.array_equal(out1["out"], expected["out"])
    assert np.array_equal(out2["mid"], expected["mid"])
    groups = pair.h1.last_groups  # one ROT each way per AND group and instance
    assert 0 < groups <= circuit.and_count
    rots = -(-(groups * n) // 128) * 128
    assert pair.h1.ots_used == pair.h2.ots_used == rots
    usable, tree_bytes = 16384 - (2048 + 64 * 8), 64 * (2 * 8 + 1) * 16
    for ch in (pair.h1_channel, pair.h2_channel):
        assert ch.counters()["ot_extension"]["sent"] == -(-rots // usable) * tree_bytes
        assert ch.counters()["tables"]["sent"] == (groups + circuit.and_count) * -(-n // 8)
    first = pair.h1.last_transcript
    again1, again2 = pair.run(circuit, {"g": g}, {"e": e})
    assert np.array_equal(again1["out"], expected["out"])
    assert np.array_equal(again2["mid"], expected["mid"])
    assert pair.h1.last_transcript != first


def test_random_ot_sources_must_match(gmw_pair):
    pair = gmw_pair()
    silent = GmwParty(pair.h2_channel, "evaluator", ot="silent-test-only")
    side = Background(pair.h1.setup)
    with pytest.raises(ProtocolError, match="random OT mismatch"):
        silent.setup()
    with pytest.raises(ProtocolError, match="random OT mismatch"):
        side.result()


def test_gc_backend_still_matches(two_party):
    """The same description through the garbled-circuit backend gives the GMW outputs."""
    circuit = random_circuit(6, gates=200)
    rng = np.random.default_rng(6)
    g = rng.integers(0, 1 << 13, 500, dtype=np.uint64)
    e = rng.integers(0, 1 << 11, 500, dtype=np.uint64)
    out_g, out_e = two_party().run(circuit, {"g": g}, {"e": e})
    pair = GmwPair()
    try:
        out1, out2 = pair.run(circuit, {"g": g}, {"e": e})
    finally:
        pair.close()
    assert np.array_equal(out_g["out"], out1["out"])
    assert np.array_equal(out_e["mid"], out2["mid"])


def test_bad_arguments():
    listener = Listener("127.0.0.1", 0)
    accepting = Background(lambda: listener.accept(timeout=10, insecure=True))
    ch = Channel.connect("127.0.0.1", listener.port, timeout=10, insecure=True)
    other = accepting.result()
    listener.close()
    try:
        with pytest.raises(ValueError, match="role"):
            GmwParty(ch, "h3")
        with pytest.raises(ValueError, match="ot_k"):
            GmwParty(ch, "garbler", ot_k=0)
        party = GmwParty(ch, "garbler")
        c1, _ = add_sub_circuits()
        with pytest.raises(ValueError, match="belongs to the evaluator"):
            party.run(c1, {"y": np.arange(3, dtype=np.uint64)})
        with pytest.raises(ValueError, match="missing input 'x'"):
            party.run(c1, {}, n=3)
        assert Garbler is not None  # the gc classes stay exported beside GmwParty
    finally:
        ch.close()
        other.close()


@pytest.mark.parametrize("source", ["softspoken", "silent-test-only"])
def test_round_trips_per_run_counted_by_the_channel(gmw_pair, source):
    """A run's round trips as the channel counts them: one per AND layer and one for the
    outputs; the run header travels with the first layer when the triples read nothing from
    the link (silent OT between its iterations), else it costs one more (SoftSpoken's
    corrections come back, and a silent iteration's trees are read before the first layer)."""
    circuit = random_circuit(3)
    pair = gmw_pair()
    if source != "softspoken":
        pair.h1 = GmwParty(pair.h1_channel, "garbler", ot=source)
        pair.h2 = GmwParty(pair.h2_channel, "evaluator", ot=source)
    rng = np.random.default_rng(3)
    n = 8  # few ROTs a run: the test-size silent iteration (13,824 ROTs) serves several runs
    g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
    e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
    expected = circuit.evaluate({"g": g, "e": e})
    trips = []
    for _ in range(3):
        before = pair.h1_channel.round_trips, pair.h2_channel.round_trips
        out1, out2 = pair.run(circuit, {"g": g}, {"e": e})
        assert np.array_equal(out1["out"], expected["out"])
        assert np.array_equal(out2["mid"], expected["mid"])
        after = pair.h1_channel.round_trips, pair.h2_channel.round_trips
        trips.append((after[0] - before[0], after[1] - before[1]))
    layers = pair.h1.last_layers
    assert layers > 0  # the AND layers the party exchanged (the AND-depth)
    if source == "softspoken":  # header, one step of corrections, layers, outputs
        assert trips[1:] == [(layers + 3, layers + 3)] * 2
    else:  # the first run starts an iteration (its trees); the next ones are buffered
        assert trips[1:] == [(layers + 1, layers + 1)] * 2
        assert trips[0][0] > layers + 1


@pytest.mark.parametrize("source", ["softspoken", "silent-test-only"])
def test_threads_give_the_plaintext_outputs(gmw_pair, source):
    """threads (a party's AND layers split by words of the rows and, on silent OT, its LPN
    encoding split by outputs; local to the party): H1 on three threads, H2 on one. Every AND
    gate of every instance still opens to the plaintext value, at sizes that split the layers
    (40,037 instances: 626 words a row, two ranges of at least 256) and that do not, which
    needs the threaded openings, gates and (silent) encodings to be the single-threaded bits."""
    circuit = random_circuit(4)
    pair = gmw_pair()
    pair.h1 = GmwParty(pair.h1_channel, "garbler", ot=source, threads=3)
    pair.h2 = GmwParty(pair.h2_channel, "evaluator", ot=source)
    rng = np.random.default_rng(4)
    for n in (1, 700, 40_037):
        g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
        e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
        expected = circuit.evaluate({"g": g, "e": e})
        out1, out2 = pair.run(circuit, {"g": g}, {"e": e})
        assert np.array_equal(out1["out"], expected["out"])
        assert np.array_equal(out2["mid"], expected["mid"])
    with pytest.raises(ValueError, match=r"threads must be in 1\.\.64"):
        GmwParty(pair.h1_channel, "garbler", ot="silent", threads=0)


@pytest.mark.parametrize("h2_n", [10, 20_000])
def test_a_header_read_after_the_first_layer_still_catches_a_mismatch(gmw_pair, h2_n):
    """On silent OT between iterations the peer's run header is read after this party sent its
    first layer (one round trip less): a peer running another circuit is still a ProtocolError
    on both sides, before any opening is read; also when only one side's triples need a new
    iteration (h2_n: H2's instance count makes its run start one, so it reads the header first)."""
    c1, c2 = add_sub_circuits()
    pair = gmw_pair()
    pair.h1 = GmwParty(pair.h1_channel, "garbler", ot="silent-test-only")
    pair.h2 = GmwParty(pair.h2_channel, "evaluator", ot="silent-test-only")
    xs = np.arange(10, dtype=np.uint64)
    out1, out2 = pair.run(c1, {"x": xs}, {"y": xs})  # setup, and the first iteration
    assert out1["y"].tolist() == out2["y"].tolist() == (2 * xs).tolist()
    ys = np.arange(h2_n, dtype=np.uint64) % 256
    side = Background(lambda: pair.h1.run(c1, {"x": xs}))
    with pytest.raises(ProtocolError, match="mismatch"):
        pair.h2.run(c2, {"y": ys})
    with pytest.raises(ProtocolError, match="mismatch"):
        side.result()
    with pytest.raises(ProtocolError, match="out of step"):
        pair.h1.run(c1, {"x": xs})
