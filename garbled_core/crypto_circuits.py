"""SHA-256 and ChaCha20 as circuits on :class:`garbled_core.circuit.CircuitBuilder`.

They let a server prove, in zero knowledge (``zk_proof.h``), that the random bits it entered
are the expansion of the seed it committed to: the commitment is SHA-256 (FIPS 180-4), the
expansion ChaCha's block function (RFC 8439; the servers use ChaCha8), whose 32-bit additions
cost 31 AND gates each (ChaCha20: about 10,400 AND gates for 512 bits of stream; ChaCha8 about
4,400; AES-256 about 7,000 for 128 bits).

Words are :class:`~garbled_core.circuit.Bits` of 32, least significant bit first; public
values fold into constants, so a block of SHA-256 whose message is public costs no gate.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from garbled_core.circuit import Bits, CircuitBuilder

__all__ = [
    "CHACHA_CONSTANTS",
    "chacha_block",
    "rotl",
    "sha256_midstate",
    "sha256_words",
]

WORD = 32
MASK32 = (1 << WORD) - 1

# "expand 32-byte k", little-endian words (RFC 8439 2.3).
CHACHA_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)

_SHA_K = (
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
)  # fmt: skip
_SHA_H0 = (
    0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19,
)  # fmt: skip


def rotl(x: Bits, r: int) -> Bits:
    """x rotated left by r (bits are LSB first: bit i moves to i + r)."""
    w = len(x)
    r %= w
    return x[w - r :].concat(x[: w - r]) if r else x


def _rotr(x: Bits, r: int) -> Bits:
    return rotl(x, len(x) - r)


def _shr(b: CircuitBuilder, x: Bits, r: int) -> Bits:
    return x[r:].concat(b.const(0, r))


def _word(b: CircuitBuilder, x: Bits | int) -> Bits:
    if isinstance(x, int):
        return b.const(x & MASK32, WORD)
    if len(x) != WORD:
        raise ValueError(f"a word has {WORD} bits, not {len(x)}")
    return x


def chacha_block(
    b: CircuitBuilder,
    key: Sequence[Bits | int],
    counter: Bits | int,
    nonce: Sequence[Bits | int],
    rounds: int = 20,
) -> list[Bits]:
    """ChaCha's block function (RFC 8439 2.3; ``rounds`` 20, or 8 for ChaCha8): 16 output
    words from 8 key words, the block counter and 3 nonce words (each a 32-bit word or an int).
    The key stream's bytes are the words little-endian, word 0 first."""
    if len(key) != 8 or len(nonce) != 3:
        raise ValueError("ChaCha takes 8 key words and 3 nonce words")
    if rounds not in range(2, 21, 2):
        raise ValueError(f"ChaCha's rounds are 2, 4, .., 20, not {rounds}")
    state = (
        [_word(b, c) for c in CHACHA_CONSTANTS]
        + [_word(b, k) for k in key]
        + [_word(b, counter)]
        + [_word(b, v) for v in nonce]
    )
    x = list(state)

    def quarter(i: int, j: int, k: int, m: int) -> None:
        x[i] = b.add(x[i], x[j])
        x[m] = rotl(b.xor(x[m], x[i]), 16)
        x[k] = b.add(x[k], x[m])
        x[j] = rotl(b.xor(x[j], x[k]), 12)
        x[i] = b.add(x[i], x[j])
        x[m] = rotl(b.xor(x[m], x[i]), 8)
        x[k] = b.add(x[k], x[m])
        x[j] = rotl(b.xor(x[j], x[k]), 7)

    for _ in range(rounds // 2):
        quarter(0, 4, 8, 12)
        quarter(1, 5, 9, 13)
        quarter(2, 6, 10, 14)
        quarter(3, 7, 11, 15)
        quarter(0, 5, 10, 15)
        quarter(1, 6, 11, 12)
        quarter(2, 7, 8, 13)
        quarter(3, 4, 9, 14)
    return [b.add(x[i], state[i]) for i in range(16)]


def _sha256_compress(b: CircuitBuilder, h: list[Bits], block: list[Bits]) -> list[Bits]:
    w = list(block)
    for t in range(16, 64):
        s0 = b.xor(b.xor(_rotr(w[t - 15], 7), _rotr(w[t - 15], 18)), _shr(b, w[t - 15], 3))
        s1 = b.xor(b.xor(_rotr(w[t - 2], 17), _rotr(w[t - 2], 19)), _shr(b, w[t - 2], 10))
        w.append(b.add(b.add(w[t - 16], s0), b.add(w[t - 7], s1)))
    a, bb, c, d, e, f, g, hh = h
    for t in range(64):
        big1 = b.xor(b.xor(_rotr(e, 6), _rotr(e, 11)), _rotr(e, 25))
        choose = b.xor(g, b.and_(e, b.xor(f, g)))  # e ? f : g, one AND a bit
        t1 = b.add(b.add(b.add(hh, big1), b.add(choose, _word(b, _SHA_K[t]))), w[t])
        big0 = b.xor(b.xor(_rotr(a, 2), _rotr(a, 13)), _rotr(a, 22))
        majority = b.xor(b.and_(b.xor(a, bb), b.xor(a, c)), a)  # one AND a bit
        t2 = b.add(big0, majority)
        hh, g, f, e, d, c, bb, a = g, f, e, b.add(d, t1), c, bb, a, b.add(t1, t2)
    return [b.add(x, y) for x, y in zip(h, (a, bb, c, d, e, f, g, hh), strict=True)]


def sha256_words(
    b: CircuitBuilder,
    message: Sequence[Bits | int],
    state: Sequence[Bits | int] | None = None,
    hashed: int = 0,
) -> list[Bits]:
    """SHA-256 (FIPS 180-4) of a message of bytes, each an 8-bit Bits or an int; the digest as
    8 big-endian words (word 0 holds digest bytes 0 to 3, byte 0 in its top 8 bits). ``state``
    and ``hashed``: the message continues one whose first ``hashed`` bytes (a multiple of 64)
    were compressed to ``state`` (8 words, :func:`sha256_midstate`), so that a public prefix
    costs no gate."""
    if hashed % 64:
        raise ValueError(f"a midstate covers whole 64-byte blocks, not {hashed} bytes")
    data: list[Bits] = [b.const(m, 8) if isinstance(m, int) else m for m in message]
    if any(len(m) != 8 for m in data):
        raise ValueError("a message byte has 8 bits")
    length = hashed + len(data)
    padded = [*data, b.const(0x80, 8)]
    while len(padded) % 64 != 56:
        padded.append(b.const(0, 8))
    padded += [b.const(v, 8) for v in (8 * length).to_bytes(8, "big")]
    h = [_word(b, v) for v in (_SHA_H0 if state is None else state)]
    for start in range(0, len(padded), 64):
        chunk = padded[start : start + 64]
        words = [
            chunk[4 * i + 3].concat(chunk[4 * i + 2], chunk[4 * i + 1], chunk[4 * i])
            for i in range(16)
        ]  # big endian: the first byte is the top one
        h = _sha256_compress(b, h, words)
    return h


@functools.lru_cache(maxsize=1)
def _compress_circuit() -> Any:
    """One SHA-256 compression as a circuit: state ``s0``..``s3`` and block ``w0``..``w7``
    (64-bit ports, each two big-endian words, the first in the low half) to ``h0``..``h3``."""
    b = CircuitBuilder("sha256-compress")
    state = [b.input(f"s{k}", "evaluator", 64) for k in range(4)]
    block = [b.input(f"w{k}", "evaluator", 64) for k in range(8)]
    h = _sha256_compress(
        b, [p[32 * i : 32 * i + 32] for p in state for i in range(2)],
        [p[32 * i : 32 * i + 32] for p in block for i in range(2)],
    )  # fmt: skip
    for k in range(4):
        b.output(f"h{k}", h[2 * k].concat(h[2 * k + 1]), "both")
    return b.description().build()


def sha256_midstate(data: bytes) -> tuple[int, ...]:
    """SHA-256's state (8 words) after the whole 64-byte blocks of ``data`` (its length a
    multiple of 64), computed by the compression circuit evaluated in the clear."""
    if len(data) % 64:
        raise ValueError(f"a midstate covers whole 64-byte blocks, not {len(data)} bytes")
    circuit = _compress_circuit()
    state = list(_SHA_H0)
    for start in range(0, len(data), 64):
        words = [int.from_bytes(data[start + 4 * i : start + 4 * i + 4], "big") for i in range(16)]
        pairs = [("s", state, 4), ("w", words, 8)]
        inputs = {
            f"{name}{k}": np.array([v[2 * k] | v[2 * k + 1] << 32], dtype=np.uint64)
            for name, v, ports in pairs
            for k in range(ports)
        }
        out = circuit.evaluate(inputs, 1)
        state = [int(out[f"h{k}"][0]) >> (32 * i) & MASK32 for k in range(4) for i in range(2)]
    return tuple(state)
