"""Zero-knowledge proofs over authenticated bits (zk_proof.h, QuickSilver's proof for circuits
over GF(2)): both servers prove at once, each the other's verifier. An honest proof of a seed's
SHA-256 commitment and its ChaCha20 expansion gives the verifier the true digest and
authenticated stream bits that open to the true key stream; every cheat is caught, and each
check has its control: the same cheat passes when the cheater is handed what the check hides
(the verifier's Delta, or its coin before the corrections).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from helpers import Background

from garbled_core import _core
from garbled_core.circuit import CircuitBuilder
from garbled_core.crypto_circuits import chacha_block, sha256_words

PREFIX = b"spgc.test.seed-commitment\x00run-7\x00" + (3).to_bytes(8, "big")


def _le_bytes(word):
    """A big-endian SHA-256 word's bytes in little-endian order (digest bytes as a LE uint64)."""
    return word[24:32].concat(word[16:24], word[8:16], word[0:8])


def commitment_circuit(prefix: bytes = PREFIX):
    """seed0..3 (private) -> d0..3 = SHA-256(prefix || seed) opened, k0..3 = the seed kept."""
    b = CircuitBuilder("test-commitment")
    seed = [b.input(f"seed{k}", "garbler", 64) for k in range(4)]
    digest = sha256_words(b, list(prefix) + [p[8 * j : 8 * j + 8] for p in seed for j in range(8)])
    for k in range(4):
        b.output(f"d{k}", _le_bytes(digest[2 * k]).concat(_le_bytes(digest[2 * k + 1])), "both")
    for k in range(4):
        b.output(f"k{k}", seed[k], "keep")
    return b.description().build()


def expansion_circuit():
    """seed0..3 (carried) with a public counter and nonce -> s0..7 = ChaCha20 key stream kept."""
    b = CircuitBuilder("test-expansion")
    seed = [b.input(f"seed{k}", "carried", 64) for k in range(4)]
    counter = b.input("counter", "evaluator", 32)
    nonce = [b.input(f"nonce{k}", "evaluator", 32) for k in range(3)]
    words = chacha_block(
        b, [p[32 * i : 32 * i + 32] for p in seed for i in range(2)], counter, nonce
    )
    for k in range(8):
        b.output(f"s{k}", words[2 * k].concat(words[2 * k + 1]), "keep")
    return b.description().build()


def product_circuit():
    """x, y (private, 16 bits) -> x * y (32 bits) opened and kept: about 300 AND gates."""
    b = CircuitBuilder("test-product")
    x = b.input("x", "garbler", 16)
    y = b.input("y", "garbler", 16)
    wide = b.mul(x.concat(b.const(0, 16)), y.concat(b.const(0, 16)))
    b.output("p", wide, "both")
    return b.description().build()


NONCE = (7, 0xDEADBEEF, 0x1234)


def seed_steps(seed: bytes | None, blocks: int, commitment, expansion):
    """The two steps of a seed proof: the commitment (n = 1), then `blocks` ChaCha20 blocks
    keyed by the committed seed. seed None: the verifier's copy (no private values)."""
    words = [int.from_bytes(seed[8 * k : 8 * k + 8], "little") for k in range(4)] if seed else None
    first = {
        "circuit": commitment,
        "n": 1,
        "values": [[w] for w in words] if words else [[] for _ in range(4)],
        "broadcast": [False] * 4,
    }
    second = {
        "circuit": expansion,
        "n": blocks,
        "values": [[], [], [], [], list(range(blocks))] + [[v] for v in NONCE],
        "broadcast": [True] * 4 + [False] + [True] * 3,
        "carried": [(0, 4 + k) for k in range(4)] + [None] * 4,
    }
    return [first, second]


def key_stream(seed: bytes, blocks: int) -> list[bytes]:
    nonce = b"".join(v.to_bytes(4, "little") for v in NONCE)
    return [
        Cipher(algorithms.ChaCha20(seed, i.to_bytes(4, "little") + nonce), None)
        .encryptor()
        .update(bytes(64))
        for i in range(blocks)
    ]


def stream_from_kept(kept: list[list[int]], blocks: int) -> list[bytes]:
    """The 8 kept ports (bit k of instance i at k * blocks + i) as each block's 64 bytes."""
    out = []
    for i in range(blocks):
        words = [sum(port[k * blocks + i] << k for k in range(64)) for port in kept]
        out.append(b"".join(w.to_bytes(8, "little") for w in words))
    return out


def digest_from_opened(opened: list[list[int]]) -> bytes:
    return b"".join(int(opened[k][0]).to_bytes(8, "little") for k in range(4))


def run_pair(two_party, first_steps, second_steps, first_checks, second_checks, **kw):
    """H1 proves first_steps and checks second_checks; H2 the other way; kw for H1 (the
    cheater), `both` options for both sides. Returns (H1's result, H2's result)."""
    tp = two_party()
    both = kw.pop("both", {})
    cheater = Background(
        lambda: _core._zk_proof_session(
            tp.garbler_channel, True, first_steps, second_checks, **kw, **both
        )
    )
    honest = _core._zk_proof_session(
        tp.evaluator_channel, False, second_steps, first_checks, **both
    )
    if honest["caught"]:
        tp.evaluator_channel.close()
    try:
        first = cheater.result()
    except (_core.ChannelError, _core.PeerDeviated):
        first = None
    return first, honest


@pytest.fixture(scope="module")
def circuits():
    return commitment_circuit(), expansion_circuit(), product_circuit()


def test_both_servers_prove_their_seeds_commitment_and_expansion(two_party, circuits):
    """Each server proves SHA-256(prefix || seed) and 3 blocks of ChaCha20 under that seed;
    the other learns the digest and holds the stream as authenticated bits that open to the
    true key stream (a sharing the authenticated protocols take as it is)."""
    commitment, expansion, _ = circuits
    s1, s2 = os.urandom(32), os.urandom(32)
    h1, h2 = run_pair(
        two_party,
        seed_steps(s1, 3, commitment, expansion),
        seed_steps(s2, 2, commitment, expansion),
        seed_steps(None, 3, commitment, expansion),
        seed_steps(None, 2, commitment, expansion),
        both={"open_kept": True},
    )
    assert not h1["caught"] and not h2["caught"], (h1["message"], h2["message"])
    assert digest_from_opened(h2["checked_opened"][0]) == hashlib.sha256(PREFIX + s1).digest()
    assert digest_from_opened(h1["checked_opened"][0]) == hashlib.sha256(PREFIX + s2).digest()
    for side, seed, blocks, key in (
        (h1, s1, 3, "kept_mine"),
        (h2, s1, 3, "kept_theirs"),
        (h2, s2, 2, "kept_mine"),
        (h1, s2, 2, "kept_theirs"),
    ):
        assert stream_from_kept(side[key][1], blocks) == key_stream(seed, blocks), key
        assert [int(sum(side[key][0][4 + k][j] << j for j in range(64))) for k in range(4)] == [
            int.from_bytes(seed[8 * k : 8 * k + 8], "little") for k in range(4)
        ]
    assert h1["ands"] == commitment.and_count + 3 * expansion.and_count
    assert h2["ands"] == commitment.and_count + 2 * expansion.and_count
    # A correction bit a proved AND gate, at least (the COTs' own bytes come on top).
    assert h1["bytes_sent"] > h1["ands"] / 8


def test_several_batches_are_each_checked(two_party, circuits):
    """More AND gates than a batch holds: several coins, each after its batch's corrections."""
    _, expansion, _ = circuits
    per_batch = max(1, _core._ZK_ANDS_PER_BATCH // expansion.and_count)
    blocks = 2 * per_batch + 3
    commitment = circuits[0]
    seed = os.urandom(32)
    h1, h2 = run_pair(
        two_party,
        seed_steps(seed, blocks, commitment, expansion),
        [None, None],
        seed_steps(None, blocks, commitment, expansion),
        [None, None],
        both={"open_kept": True},
    )
    assert not h2["caught"], h2["message"]
    assert h1["batches"] == 1 + 3
    assert stream_from_kept(h2["kept_theirs"][1], blocks)[-1] == key_stream(seed, blocks)[-1]
    # a wrong AND gate in the last batch is caught too
    _, caught = run_pair(
        two_party,
        seed_steps(seed, blocks, commitment, expansion),
        [None, None],
        seed_steps(None, blocks, commitment, expansion),
        [None, None],
        cheat="flip_and",
        index=commitment.and_count + (blocks - 1) * expansion.and_count + 5,
    )
    assert caught["caught"] and "batch 2" in caught["message"], caught["message"]


def product_steps(values, n):
    x, y = values if values else ([], [])
    return [{"circuit": PRODUCT, "n": n, "values": [x, y], "broadcast": [False, False]}]


PRODUCT = product_circuit()


def prove_product(two_party, **kw):
    x, y = product_values()
    h1, h2 = run_pair(
        two_party, product_steps((x, y), 4), [None], product_steps(None, 4), [None], **kw
    )
    return [a * b for a, b in zip(x, y, strict=True)], h1, h2


def product_values(seed: int = 5) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(seed)
    return (
        [int(v) for v in rng.integers(0, 1 << 16, 4)],
        [int(v) for v in rng.integers(0, 1 << 16, 4)],
    )


def cheat_with_the_verifiers_delta(two_party, cheat: str, index: int, x=None, y=None):
    """The control of a check on Delta: H1 cheats with `offset` = H2's true Delta (H2 made to
    use that Delta), as a cheater who had learnt it would. Returns (H1's, H2's) results."""
    delta = bytearray(os.urandom(16))
    delta[0] |= 1
    if x is None:
        x, y = product_values()
    tp = two_party()
    cheater = Background(
        lambda: _core._zk_proof_session(
            tp.garbler_channel, True, product_steps((x, y), 4), [None],
            cheat=cheat, index=index, offset=bytes(delta),
        )
    )  # fmt: skip
    honest = _core._zk_proof_session(
        tp.evaluator_channel, False, [None], product_steps(None, 4), delta=bytes(delta)
    )
    return cheater.result(), honest


def test_an_honest_product_opens_to_its_value(two_party):
    want, _, h2 = prove_product(two_party)
    assert not h2["caught"]
    assert h2["checked_opened"][0][0] == want


@pytest.mark.parametrize("index", [0, 150, 4 * PRODUCT.and_count - 1])
def test_a_wrong_and_gate_is_caught_and_passes_only_with_the_verifiers_delta(two_party, index):
    """The prover outputs a wrong AND gate (and so may open a false product). Caught by the
    batch check; the control, the same cheater compensating with the verifier's true Delta in
    its answer, is accepted: the check on Delta is what stops it."""
    _, _, caught = prove_product(two_party, cheat="flip_and", index=index)
    assert caught["caught"] and "zero-knowledge proof" in caught["message"]
    cheater, honest = cheat_with_the_verifiers_delta(two_party, "flip_and", index)
    assert not honest["caught"]
    assert honest["checked_opened"][0][0] == cheater["own_opened"][0][0]


def test_a_flipped_and_gate_changes_the_statement(two_party):
    """The cheat of the test above is a real one: with the check passed (the control), the
    opened product is not x * y for some AND gates flipped."""
    wrong = 0
    x, y = [40000, 3, 5, 7], [50000, 11, 13, 17]
    for index in range(0, 4 * PRODUCT.and_count, 97):
        _, honest = cheat_with_the_verifiers_delta(two_party, "flip_and", index, x, y)
        assert not honest["caught"]
        wrong += honest["checked_opened"][0][0] != [a * b for a, b in zip(x, y, strict=True)]
    assert wrong > 0


def test_a_wrong_opened_bit_is_caught_and_passes_only_with_the_verifiers_delta(two_party):
    want, _, caught = prove_product(two_party, cheat="flip_opened", index=33)
    assert caught["caught"] and "opened outputs" in caught["message"]
    _, honest = cheat_with_the_verifiers_delta(two_party, "flip_opened", 33)
    assert not honest["caught"]
    # bit 33 is bit 8 of instance 1: the opened bits go bit by bit, each over the instances
    assert honest["checked_opened"][0][0] != want
    assert honest["checked_opened"][0][0][1] == want[1] ^ (1 << 8)


def test_a_forger_who_knows_the_coin_first_passes_and_one_who_guesses_it_is_caught(two_party):
    """The coin must follow the corrections: a prover that sees it first picks wrong AND gates
    whose chi sum to zero (linear algebra over 129 of them) and proves a false product; the
    same forger, when the coin comes after, can only guess it, and is caught."""
    want, _, early = prove_product(
        two_party, cheat="forge_with_early_coin", both={"coin_first": True}
    )
    assert not early["caught"]
    assert early["checked_opened"][0][0] != want
    _, _, guessed = prove_product(two_party, cheat="forge_with_early_coin")
    assert guessed["caught"] and "zero-knowledge proof" in guessed["message"]


def test_different_statements_are_refused_before_any_proof(two_party):
    tp = two_party()
    x, y = [1, 2], [3, 4]
    other = product_steps(None, 3)
    side = Background(
        lambda: _core._zk_proof_session(tp.garbler_channel, True, product_steps((x, y), 2), [None])
    )
    with pytest.raises(_core.ProtocolError, match="different proof statements"):
        _core._zk_proof_session(tp.evaluator_channel, False, [None], other)
    with pytest.raises((_core.ProtocolError, _core.ChannelError)):
        side.result()


def test_bad_statements_are_refused_in_one_line(two_party):
    tp = two_party()
    with pytest.raises(_core.ProtocolError, match="needs 2 values"):
        _core._zk_proof_session(
            tp.garbler_channel, True, [{"circuit": PRODUCT, "n": 2, "values": [[1], [2, 3]],
                                        "broadcast": [False, False]}], [None],
        )  # fmt: skip
    with pytest.raises(_core.ProtocolError, match="private port"):
        _core._zk_proof_session(
            tp.garbler_channel, True, [None], [{"circuit": PRODUCT, "n": 1, "values": [[1], [2]],
                                                "broadcast": [False, False]}],
        )  # fmt: skip


@pytest.mark.parametrize("rounds", [12, 20])
def test_the_chacha_kernel_and_circuit_agree(rounds):
    """The kernel the servers expand their seeds with (chacha_blocks) and the circuit they
    prove (chacha_block) give the same blocks; at 20 rounds both are RFC 8439's ChaCha20."""
    key = os.urandom(32)
    counters = np.array([0, 1, 65537], dtype=np.uint64)
    nonces = np.array([[1, 2, 3], [4, 5, 6], [0xFFFFFFFF, 0, 7]], dtype=np.uint64)
    kernel = _core.chacha_blocks(key, counters, nonces, rounds)
    b = CircuitBuilder(f"test-chacha{rounds}")
    k = [b.input(f"k{i}", "evaluator", 32) for i in range(8)]
    c = b.input("c", "evaluator", 32)
    n = [b.input(f"n{i}", "evaluator", 32) for i in range(3)]
    for i, w in enumerate(chacha_block(b, k, c, n, rounds)):
        b.output(f"w{i}", w, "both")
    circuit = b.description().build()
    words = np.frombuffer(key, dtype="<u4").astype(np.uint64)
    inputs = {f"k{i}": np.full(3, words[i], dtype=np.uint64) for i in range(8)}
    inputs["c"] = counters
    inputs.update({f"n{i}": np.ascontiguousarray(nonces[:, i]) for i in range(3)})
    out = circuit.evaluate(inputs, 3)
    assert np.array_equal(np.stack([out[f"w{i}"] for i in range(16)], axis=1), kernel)
    if rounds == 20:
        nonce = b"".join(int(v).to_bytes(4, "little") for v in nonces[2])
        rfc = Cipher(algorithms.ChaCha20(key, (65537).to_bytes(4, "little") + nonce), None)
        assert kernel[2].astype("<u4").tobytes() == rfc.encryptor().update(bytes(64))


def test_a_first_message_of_another_length_is_refused_before_it_is_read(two_party):
    """The statements' digest is public: a prover that states it right but sends (and states) a
    longer first message than the statements make is refused on the length, before its
    corrections are read as anything."""
    tp = two_party()
    x, y = product_values()
    side = Background(
        lambda: _core._zk_proof_session(
            tp.garbler_channel, True, product_steps((x, y), 4), [None],
            cheat="misstate_length", index=16,
        )
    )  # fmt: skip
    with pytest.raises(_core.ProtocolError, match="different proof statements"):
        _core._zk_proof_session(tp.evaluator_channel, False, [None], product_steps(None, 4))
    tp.evaluator_channel.close()
    with pytest.raises((_core.ProtocolError, _core.ChannelError)):
        side.result()
