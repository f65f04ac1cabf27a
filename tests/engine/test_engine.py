"""Garbled evaluation agrees with plaintext evaluation of the same circuit.

These tests double as a tour of the engine: build a circuit once, run it in
plaintext, then as garbler and evaluator over loopback, and compare.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO_ROOT, Background, tls_config

from garbled_core import (
    DEFAULT_CHUNK,
    DEFAULT_OT_K,
    CircuitBuilder,
    Evaluator,
    Garbler,
    ProtocolError,
    _core,
    available_and_kernels,
    set_and_kernel,
)

MASK32 = (1 << 32) - 1


@pytest.fixture(params=available_and_kernels())
def kernel(request):
    """Runs a test under every AND kernel this CPU has (VAES and plain AES-NI)."""
    previous = _core.and_kernel()
    set_and_kernel(request.param)
    yield request.param
    set_and_kernel(previous)


@pytest.fixture(
    params=[f"{s}-{k}" for s in ("threehalves", "halfgates") for k in available_and_kernels()]
)
def garbling(request):
    """Session options for every way of garbling an AND gate: three-halves and half-gates,
    each under every AES path this CPU has (VAES and plain AES-NI)."""
    scheme, _, name = request.param.partition("-")
    previous = _core.and_kernel()
    if name:
        set_and_kernel(name)
    yield {"scheme": scheme}
    set_and_kernel(previous)


def edge_and_random(n_random: int, width: int, seed: int) -> np.ndarray:
    """Edge values of a width-bit two's-complement port, then random ones."""
    top = (1 << width) - 1
    edges = [0, 1, top, top - 1, 1 << (width - 1), (1 << (width - 1)) - 1]
    rng = np.random.default_rng(seed)
    rand = (
        rng.integers(0, 1 << width, n_random, dtype=np.uint64)
        if width < 64
        else (
            rng.integers(0, 1 << 63, n_random, dtype=np.uint64) * np.uint64(2)
            + rng.integers(0, 2, n_random, dtype=np.uint64)
        )
    )
    return np.concatenate([np.array(edges, dtype=np.uint64), rand])


def all_pairs(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(xs, len(ys)), np.tile(ys, len(xs))


def gadget_circuit(width: int):
    """Every gadget once, on a garbler input x and an evaluator input y."""
    b = CircuitBuilder(f"gadgets{width}")
    x = b.input("x", owner="garbler", width=width)
    y = b.input("y", owner="evaluator", width=width)
    b.output("add", b.add(x, y))
    b.output("sub", b.sub(x, y))
    b.output("neg", b.neg(y))
    b.output("lt_s", b.lt_signed(x, y))
    b.output("lt_u", b.lt_unsigned(x, y))
    b.output("eq", b.eq(x, y))
    b.output("mux", b.mux(b.lt_signed(x, y), x, y))
    b.output("shl", b.shl(y, 3 % width))
    b.output("sar", b.shr_arith(x, 1))
    b.output("sext", b.sign_extend(y[: max(1, width // 2)], width))
    b.output("mulc", b.mul_const(x, -7, width))
    b.output("pop", b.popcount(b.xor(x, y)))
    return b.build()


@pytest.mark.parametrize("width", [1, 8, 32, 64])
def test_every_gadget_garbled_equals_plaintext(two_party, garbling, width):
    circuit = gadget_circuit(width)
    xs, ys = all_pairs(edge_and_random(20, width, 1), edge_and_random(20, width, 2))
    expected = circuit.evaluate({"x": xs, "y": ys})
    out_g, out_e = two_party(chunk=64, **garbling).run(circuit, {"x": xs}, {"y": ys})
    for name, values in expected.items():
        assert np.array_equal(out_g[name], values), name
        assert np.array_equal(out_e[name], values), name


def test_gadgets_over_tls(two_party, pki):
    circuit = gadget_circuit(32)
    xs, ys = all_pairs(edge_and_random(30, 32, 3), edge_and_random(30, 32, 4))
    expected = circuit.evaluate({"x": xs, "y": ys})
    tp = two_party(tls=(tls_config(pki, "h1"), tls_config(pki, "h2")))
    assert tp.garbler_channel.is_tls and tp.evaluator_channel.is_tls
    out_g, out_e = tp.run(circuit, {"x": xs}, {"y": ys})
    for name, values in expected.items():
        assert np.array_equal(out_e[name], values), name
        assert np.array_equal(out_g[name], values), name


def random_circuit(seed: int, gates: int = 400):
    """A random soup of AND/XOR/NOT over inputs of both parties."""
    rng = np.random.default_rng(seed)
    b = CircuitBuilder(f"random{seed}")
    pool = list(b.input("g", owner="garbler", width=13)) + list(
        b.input("e", owner="evaluator", width=11)
    )
    for _ in range(gates):
        op = rng.integers(0, 3)
        i, j = rng.integers(0, len(pool), 2)
        if op == 0:
            pool.append(b.and_(pool[i], pool[j]))
        elif op == 1:
            pool.append(b.xor(pool[i], pool[j]))
        else:
            pool.append(b.not_(pool[i]))
    tail = pool[-64:]
    b.output("out", b.concat(*tail))
    b.output("mid", b.concat(*pool[len(pool) // 2 : len(pool) // 2 + 17]), reveal="evaluator")
    return b.build()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_circuits(two_party, garbling, seed):
    circuit = random_circuit(seed)
    assert circuit.and_count > 50
    rng = np.random.default_rng(seed)
    n = 1000 + seed * 37  # not a multiple of the chunk or the hash group
    g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
    e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
    expected = circuit.evaluate({"g": g, "e": e})
    out_g, out_e = two_party(chunk=128, **garbling).run(circuit, {"g": g}, {"e": e})
    assert np.array_equal(out_g["out"], expected["out"])
    assert np.array_equal(out_e["out"], expected["out"])
    assert np.array_equal(out_e["mid"], expected["mid"])
    assert "mid" not in out_g  # revealed to the evaluator only


def test_reveal_modes(two_party):
    b = CircuitBuilder("reveal")
    x = b.input("x", owner="garbler", width=16)
    y = b.input("y", owner="evaluator", width=16)
    s = b.add(x, y)
    b.output("both", s, reveal="both")
    b.output("to_garbler", b.xor(x, y), reveal="garbler")
    b.output("to_evaluator", b.sub(x, y), reveal="evaluator")
    b.output("shared", s, reveal="shares")
    circuit = b.build()
    rng = np.random.default_rng(7)
    xs = rng.integers(0, 1 << 16, 3001, dtype=np.uint64)
    ys = rng.integers(0, 1 << 16, 3001, dtype=np.uint64)
    expected = circuit.evaluate({"x": xs, "y": ys})
    out_g, out_e = two_party(chunk=256).run(circuit, {"x": xs}, {"y": ys})
    assert sorted(out_g) == ["both", "shared", "to_garbler"]
    assert sorted(out_e) == ["both", "shared", "to_evaluator"]
    assert np.array_equal(out_g["to_garbler"], expected["to_garbler"])
    assert np.array_equal(out_e["to_evaluator"], expected["to_evaluator"])
    # XOR shares: each alone looks random, together they are the value.
    assert np.array_equal(out_g["shared"] ^ out_e["shared"], expected["shared"])
    assert not np.array_equal(out_g["shared"], expected["shared"])


def test_multi_stage_session_carries_selected_labels(two_party):
    """Stage 1 reveals an accept bit and keeps a value; stage 2 continues from the
    accepted instances only (the noise sampler's pattern)."""
    b1 = CircuitBuilder("stage1")
    x = b1.input("x", owner="garbler", width=24)
    y = b1.input("y", owner="evaluator", width=24)
    total = b1.add(x, y)
    b1.output("accept", total[0], reveal="both")  # reveal one bit
    b1.output("total", total, reveal="keep")  # keep the rest secret
    stage1 = b1.build()
    b2 = CircuitBuilder("stage2")
    t = b2.input("total", owner="carried", width=24)
    z = b2.input("z", owner="evaluator", width=24)
    b2.output("result", b2.add(b2.mul_const(t, 3, 24), z))
    stage2 = b2.build()

    rng = np.random.default_rng(11)
    n = 5000
    xs = rng.integers(0, 1 << 24, n, dtype=np.uint64)
    ys = rng.integers(0, 1 << 24, n, dtype=np.uint64)
    tp = two_party(chunk=512)
    g1, e1 = tp.run(stage1, {"x": xs}, {"y": ys})
    assert np.array_equal(g1["accept"], e1["accept"])
    assert g1["total"].n == n and g1["total"].width == 24
    accepted = np.flatnonzero(e1["accept"]).astype(np.uint64)
    zs = rng.integers(0, 1 << 24, len(accepted), dtype=np.uint64)
    g2, e2 = tp.run(
        stage2,
        evaluator_inputs={"z": zs},
        garbler_carried={"total": g1["total"].select(accepted)},
        evaluator_carried={"total": e1["total"].select(accepted)},
    )
    totals = (xs + ys) & np.uint64((1 << 24) - 1)
    want = (totals[accepted] * np.uint64(3) + zs) & np.uint64((1 << 24) - 1)
    assert np.array_equal(e2["result"], want)
    assert np.array_equal(g2["result"], want)
    plain = stage2.evaluate({"total": totals[accepted], "z": zs})
    assert np.array_equal(plain["result"], want)


def table_bytes(scheme: str, n: int) -> int:
    """One AND gate over n instances: half-gates 2 blocks; three-halves 3 half-blocks and 5
    control bits per instance, the bits packed at the end of the gate's table."""
    return 32 * n if scheme == "halfgates" else 24 * n + -(-5 * n // 8)


def expected_bytes(
    circuit,
    n: int,
    chunk: int,
    runs: int = 1,
    scheme: str = "threehalves",
    ot_k: int = DEFAULT_OT_K,
) -> dict:
    """Closed form of every byte each party sends in one session (chunk a multiple of 8)."""
    # OT extension: IKNP (ot_k 0) one 128-bit column per OT; SoftSpoken ceil(128/k) bits per OT,
    # after 2 * (128 - ceil(128/k)) blocks of GGM level sums at setup.
    chunks_of_delta = 128 if ot_k == 0 else -(-128 // ot_k)
    ggm_bytes = 0 if ot_k == 0 else 2 * (128 - chunks_of_delta) * 16
    and_gates = circuit.and_count
    e_bits = circuit.input_bits("evaluator")
    outputs = circuit.outputs
    to_evaluator = sum(w for _, r, w in outputs if r in ("both", "evaluator"))
    to_garbler = sum(w for _, r, w in outputs if r in ("both", "garbler"))
    chunks = [min(chunk, n - start) for start in range(0, n, chunk)]
    point = 33  # a compressed P-256 point
    return {
        "garbler": {
            "setup": 20 + 56 + 80 * runs,
            "base_ot": 128 * point,
            "tables": runs * sum(and_gates * table_bytes(scheme, c) for c in chunks),
            "outputs": runs * sum(to_evaluator * -(-c // 8) for c in chunks),
            "ot_extension": 0,
        },
        "evaluator": {
            "setup": 20 + 80 * runs,
            "base_ot": point + ggm_bytes,
            "tables": 0,
            "outputs": runs * sum(to_garbler * -(-c // 8) for c in chunks),
            # Per evaluator input bit, padded to 128 OTs per chunk.
            "ot_extension": runs
            * sum(chunks_of_delta * (-(-(e_bits * c) // 128) * 128) // 8 for c in chunks),
        },
    }


@pytest.mark.parametrize(
    ("scheme", "ot_k"),
    [("threehalves", DEFAULT_OT_K), ("threehalves", 8), ("halfgates", 0), ("threehalves", 5)],
)
@pytest.mark.parametrize("n", [1, 8, 1000, 4099])
def test_exact_byte_counts(two_party, n, scheme, ot_k):
    b = CircuitBuilder("bytes")
    a = b.input("a", owner="garbler", width=32)
    x = b.input("b", owner="evaluator", width=32)
    d = b.sub(a, x)
    b.output("y", b.mux(b.lt_signed(d, a), d, a), reveal="both")
    b.output("flag", b.eq(a, x), reveal="garbler")
    circuit = b.build()
    rng = np.random.default_rng(n)
    av = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    bv = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    chunk = 256
    tp = two_party(chunk=chunk, scheme=scheme, ot_k=ot_k)
    out_g, out_e = tp.run(circuit, {"a": av}, {"b": bv})
    plain = circuit.evaluate({"a": av, "b": bv})
    assert np.array_equal(out_e["y"], plain["y"])
    assert np.array_equal(out_g["flag"], plain["flag"])
    want = expected_bytes(circuit, n, chunk, scheme=scheme, ot_k=ot_k)
    got_g = tp.garbler_channel.counters()
    got_e = tp.evaluator_channel.counters()
    for phase, count in want["garbler"].items():
        assert got_g[phase]["sent"] == count, phase
        assert got_e[phase]["received"] == count, phase
    for phase, count in want["evaluator"].items():
        assert got_e[phase]["sent"] == count, phase
        assert got_g[phase]["received"] == count, phase
    # Per AND gate exactly 32 bytes (half-gates) or 24 bytes and 5 bits (three-halves, the
    # bits of a chunk's gate rounded up to a byte); 16 bytes per evaluator input bit when
    # n*bits fills the OTs (IKNP; SoftSpoken ceil(128 / k) bits: 2.375 bytes at k = 7, 2 at 8).
    per_and = 32 if scheme == "halfgates" else 24.625
    padding = circuit.and_count * -(-n // chunk)  # at most a byte per gate and chunk
    assert 0 <= got_g["tables"]["sent"] - per_and * circuit.and_count * n < padding
    if (32 * n) % 128 == 0:
        per_bit = {0: 16, 7: 19 / 8, 8: 2, 5: 26 / 8}[ot_k]
        assert got_e["ot_extension"]["sent"] == per_bit * 32 * n


def test_default_ot_extension_is_softspoken_k7(two_party):
    """Sessions made without ot_k use SoftSpoken k = 7: 19 correction bits (2.375 bytes) per
    evaluator input bit, within the 2.5 bytes the engine promises, after 2 * (128 - 19) blocks
    of GGM level sums."""
    assert DEFAULT_OT_K == 7
    b = CircuitBuilder("default-ot")
    a = b.input("a", owner="garbler", width=16)
    x = b.input("b", owner="evaluator", width=16)
    b.output("s", b.add(a, x), reveal="both")
    circuit = b.build()
    n = 1024
    rng = np.random.default_rng(3)
    av = rng.integers(0, 1 << 16, n, dtype=np.uint64)
    bv = rng.integers(0, 1 << 16, n, dtype=np.uint64)
    tp = two_party()
    out_g, out_e = tp.run(circuit, {"a": av}, {"b": bv})
    want = (av + bv) % (1 << 16)
    assert np.array_equal(out_g["s"], want) and np.array_equal(out_e["s"], want)
    sent = tp.evaluator_channel.counters()
    assert sent["ot_extension"]["sent"] == 19 * 16 * n // 8
    assert sent["ot_extension"]["sent"] / (16 * n) <= 2.5
    assert sent["base_ot"]["sent"] == 33 + 2 * (128 - 19) * 16


def test_runs_without_evaluator_inputs_or_outputs(two_party):
    b = CircuitBuilder("garbler-only-inputs")
    x = b.input("x", owner="garbler", width=8)
    b.output("x2", b.add(x, x), reveal="evaluator")
    circuit = b.build()
    xs = np.arange(256, dtype=np.uint64)
    tp = two_party()
    out_g, out_e = tp.run(circuit, {"x": xs}, {}, n=256)
    assert out_g == {}
    assert np.array_equal(out_e["x2"], (xs * np.uint64(2)) % np.uint64(256))
    assert tp.evaluator_channel.counters()["ot_extension"]["sent"] == 0


def test_transpose128_matches_numpy():
    rng = np.random.default_rng(5)
    m = rng.integers(0, 256, (128, 16), dtype=np.uint8)
    bits = np.unpackbits(m, axis=1, bitorder="little")  # bits[i, j]: bit j of row i
    want = np.packbits(bits.T, axis=1, bitorder="little")
    assert np.array_equal(_core._transpose128(m), want)


@pytest.mark.parametrize("ot_k", [0, 1, 3, 7, 8])
@pytest.mark.parametrize("random_choices", [False, True])
def test_ot_extension_labels_match(two_party, random_choices, ot_k):
    """The evaluator's label is q_j ^ r_j * Delta for its choice r_j: IKNP (ot_k 0, 16 bytes
    per OT) and SoftSpoken (ceil(128 / k) bits per OT; k = 3 does not divide 128)."""
    tp = two_party()
    m = 128 * 70  # several IKNP batches
    rng = np.random.default_rng(9)
    if random_choices:
        choices = np.frombuffer(_core._random_bytes(m // 8), dtype=np.uint8).copy()
    else:
        choices = np.zeros(m // 8, dtype=np.uint8)
        choices[::3] = 0xFF
        choices[1::3] = rng.integers(0, 256, len(choices[1::3]), dtype=np.uint8)
    sender = Background(lambda: _core._cot_send(tp.garbler_channel, m, ot_k))
    labels = _core._cot_recv(tp.evaluator_channel, choices, ot_k)
    delta, q = sender.result()
    r = np.unpackbits(choices, bitorder="little").astype(bool)
    assert delta[0, 0] & 1 == 1  # colour bit of Delta
    want = q.copy()
    want[r] ^= delta[0]
    assert np.array_equal(labels, want)
    assert not np.array_equal(labels[r], q[r])
    bits_per_ot = 128 if ot_k == 0 else -(-128 // ot_k)
    assert tp.evaluator_channel.counters()["ot_extension"]["sent"] == bits_per_ot * m // 8


def test_circuit_mismatch_fails_on_both_sides(two_party):
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
    c1, c2 = b1.build(), b2.build()
    assert c1.hash != c2.hash
    tp = two_party()
    xs = np.arange(10, dtype=np.uint64)
    side = Background(lambda: tp.garbler.run(c1, {"x": xs}))
    with pytest.raises(ProtocolError, match="circuit mismatch"):
        tp.evaluator.run(c2, {"y": xs})
    with pytest.raises(ProtocolError, match="circuit mismatch"):
        side.result()


def test_garbling_scheme_mismatch_fails_on_both_sides(two_party):
    b = CircuitBuilder("scheme")
    b.output(
        "y",
        b.and_(b.input("x", owner="garbler", width=1), b.input("y", owner="evaluator", width=1)),
    )
    c = b.build()
    tp = two_party()
    tp.garbler = Garbler(tp.garbler_channel, scheme="halfgates")
    ones = np.ones(4, dtype=np.uint64)
    side = Background(lambda: tp.garbler.run(c, {"x": ones}))
    with pytest.raises(ProtocolError, match="scheme mismatch: threehalves here, halfgates"):
        tp.evaluator.run(c, {"y": ones})
    with pytest.raises(ProtocolError, match="garbling scheme mismatch: halfgates here"):
        side.result()
    with pytest.raises(ValueError, match="scheme must be 'threehalves' or 'halfgates'"):
        Garbler(tp.garbler_channel, scheme="fourquarters")


def test_chunk_size_mismatch_fails_on_both_sides(two_party):
    """The chunking decides the order of tables and OTs on the wire, so the run header names
    it and parties that differ stop before a table is sent."""
    b = CircuitBuilder("chunked")
    b.output(
        "y", b.add(b.input("x", owner="garbler", width=8), b.input("y", owner="evaluator", width=8))
    )
    c = b.build()
    tp = two_party()
    tp.garbler = Garbler(tp.garbler_channel, chunk=256)
    xs = np.arange(300, dtype=np.uint64) % 256
    side = Background(lambda: tp.garbler.run(c, {"x": xs}))
    want = f"chunk size mismatch: {DEFAULT_CHUNK} instances here, 256 at the peer"
    with pytest.raises(ProtocolError, match=want):
        tp.evaluator.run(c, {"y": xs})
    with pytest.raises(ProtocolError, match="chunk size mismatch: 256 instances here"):
        side.result()
    assert tp.garbler_channel.counters()["tables"]["sent"] == 0


@pytest.mark.parametrize("threads", [1, 3])
def test_small_chunks_keep_a_long_ot_lookahead(two_party, threads):
    """With chunks of 8 instances the evaluator keeps 512 chunks of OTs in flight (4,096
    instances, as with larger chunks); a run of many more chunks than that, with a short last
    one, still matches plaintext evaluation, on one thread or several."""
    b = CircuitBuilder("small_chunks")
    x = b.input("x", owner="garbler", width=16)
    y = b.input("y", owner="evaluator", width=16)
    b.output("y", b.mux(b.lt_signed(x, y), b.sub(x, y), b.add(x, y)), reveal="both")
    c = b.build()
    n = 8 * 1200 + 5
    rng = np.random.default_rng(threads)
    xs = rng.integers(0, 1 << 16, n, dtype=np.uint64)
    ys = rng.integers(0, 1 << 16, n, dtype=np.uint64)
    tp = two_party(chunk=8)
    tp.garbler = Garbler(tp.garbler_channel, chunk=8, threads=threads)
    tp.evaluator = Evaluator(tp.evaluator_channel, chunk=8, threads=threads)
    out_g, out_e = tp.run(c, {"x": xs}, {"y": ys})
    want = c.evaluate({"x": xs, "y": ys})["y"]
    assert np.array_equal(out_g["y"], want) and np.array_equal(out_e["y"], want)


def test_threehalves_tables_are_the_derived_ones():
    """The engine's three-halves constants are what scripts/derive_threehalves.py derives,
    and the derivation's own simulation of every case (correctness, and the evaluator's
    decoded matrix uniform whatever the permute bits) passes."""
    script = REPO_ROOT / "scripts" / "derive_threehalves.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "verified" in done.stdout


@pytest.mark.parametrize("n", [1, 7, 8, 13, 16, 17, 100, 1024, 1029])
def test_threehalves_kernels_give_identical_tables(n):
    """One three-halves AND gate over n instances (short spans and groups included) under every
    AND kernel: the same output labels and the same table bytes (the VAES kernel hashes without
    the feed-forward and folds it into its case tables; the AES-NI one does not), and the
    evaluator of each kernel decodes every kernel's table to the garbler's output label (the
    zero-label XOR Delta exactly when both inputs are 1)."""
    rng = np.random.default_rng(n)
    a0 = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    b0 = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    delta = bytearray(rng.integers(0, 256, 16, dtype=np.uint8).tobytes())
    delta[0] |= 1  # colour bit of Delta
    delta = bytes(delta)
    salt = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    coins = rng.integers(0, 256, -(-n // 4), dtype=np.uint8).tobytes()
    x = rng.integers(0, 2, n).astype(bool)
    y = rng.integers(0, 2, n).astype(bool)
    d = np.frombuffer(delta, dtype=np.uint8)
    a_in, b_in = a0.copy(), b0.copy()
    a_in[x] ^= d
    b_in[y] ^= d
    previous = _core.and_kernel()
    garbled, decoded = {}, {}
    try:
        for name in available_and_kernels():
            set_and_kernel(name)
            garbled[name] = _core._garble_and_threehalves(a0, b0, delta, salt, 77, 4096, coins)
        for name in available_and_kernels():
            set_and_kernel(name)
            decoded[name] = [
                _core._eval_and_threehalves(a_in, b_in, table, salt, 77, 4096)
                for _, table in garbled.values()
            ]
    finally:
        set_and_kernel(previous)
    c0, table = garbled["aesni"]
    assert len(table) == 24 * n + -(-5 * n // 8)
    for c, t in garbled.values():
        assert np.array_equal(c, c0) and t == table
    want = c0.copy()
    want[x & y] ^= d
    for outs in decoded.values():
        for c in outs:
            assert np.array_equal(c, want)
    # a different tweak gives a different table (the hash keys depend on it)
    set_and_kernel(previous)
    assert _core._garble_and_threehalves(a0, b0, delta, salt, 78, 4096, coins)[1] != table


def test_instance_count_mismatch(two_party):
    b = CircuitBuilder("n")
    b.output(
        "y", b.add(b.input("x", owner="garbler", width=8), b.input("y", owner="evaluator", width=8))
    )
    c = b.build()
    tp = two_party()
    side = Background(lambda: tp.garbler.run(c, {"x": np.arange(10, dtype=np.uint64)}))
    with pytest.raises(ProtocolError, match="instance count"):
        tp.evaluator.run(c, {"y": np.arange(11, dtype=np.uint64)})
    with pytest.raises(ProtocolError):
        side.result()


def test_bad_inputs_are_refused_before_anything_is_sent(two_party):
    b = CircuitBuilder("inputs")
    b.output(
        "y", b.add(b.input("x", owner="garbler", width=8), b.input("y", owner="evaluator", width=8))
    )
    c = b.build()
    tp = two_party()
    with pytest.raises(ValueError, match="above its width of 8 bits"):
        tp.garbler.run(c, {"x": np.array([1, 256], dtype=np.uint64)})
    with pytest.raises(TypeError, match="uint64"):
        tp.garbler.run(c, {"x": np.array([1, 2], dtype=np.int64)})
    with pytest.raises(ValueError, match="belongs to the evaluator"):
        tp.garbler.run(c, {"x": np.zeros(2, np.uint64), "y": np.zeros(2, np.uint64)})
    with pytest.raises(ValueError, match="missing input 'x'"):
        tp.garbler.run(c, {}, n=2)
    with pytest.raises(ValueError, match="no input 'z'"):
        c.evaluate(
            {"x": np.zeros(2, np.uint64), "y": np.zeros(2, np.uint64), "z": np.zeros(2, np.uint64)}
        )
    assert tp.garbler_channel.bytes_sent == 0


def test_circuit_description_saves_and_loads(tmp_path):
    b = CircuitBuilder("saved")
    x = b.input("x", owner="garbler", width=16)
    y = b.input("y", owner="evaluator", width=16)
    b.output("d", b.sub(x, y))
    b.output("k", b.lt_signed(x, y), reveal="keep")
    desc = b.description()
    desc.save(tmp_path / "c.npz")
    loaded = type(desc).load(tmp_path / "c.npz")
    assert loaded.build().hash == desc.build().hash
    assert loaded.and_count == desc.and_count


@pytest.mark.parametrize(("garbler_threads", "evaluator_threads"), [(2, 2), (4, 1), (1, 3)])
def test_worker_threads_give_the_same_outputs(two_party, garbler_threads, evaluator_threads):
    """Parties may use different numbers of worker threads: each chunk's gates see the same
    hash tweaks whatever T, so the outputs are the same."""
    circuit = random_circuit(9)
    rng = np.random.default_rng(4)
    n = 64 * 37 + 5  # 38 chunks of 64: several waves and a short last chunk
    g = rng.integers(0, 1 << 13, n, dtype=np.uint64)
    e = rng.integers(0, 1 << 11, n, dtype=np.uint64)
    expected = circuit.evaluate({"g": g, "e": e})
    tp = two_party(chunk=64)
    tp.garbler = Garbler(tp.garbler_channel, chunk=64, threads=garbler_threads)
    tp.evaluator = Evaluator(tp.evaluator_channel, chunk=64, threads=evaluator_threads)
    out_g, out_e = tp.run(circuit, {"g": g}, {"e": e})
    assert np.array_equal(out_g["out"], expected["out"])
    assert np.array_equal(out_e["out"], expected["out"])
    assert np.array_equal(out_e["mid"], expected["mid"])
