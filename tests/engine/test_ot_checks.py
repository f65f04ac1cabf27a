"""IKNP with KOS's consistency check (iknp.h, extend_checked): the first maliciously secure
layer of issue 46 (docs/MALICIOUS.md, layer 1). An honest pair gets the same correlated OTs as
unchecked IKNP; a receiver that uses other choice bits in some matrix columns (to learn bits of
Delta) is caught unless it guesses Delta's bits there, one guess per column it changed, also
when it adapts its check values to its guess.

Each cheat below is a real receiver with the protocol's own code and a fault injected at a named
point (CotReceiver::deviate_for_test): flip (j, i) puts choice bit r_j + 1 into matrix column i
only; a guess g then fixes its check values as if Delta_i = g.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from helpers import Background

from garbled_core import _core

P = (1 << 128) | 0x87  # x^128 + x^7 + x^2 + x + 1


def gf_mul_reference(a: int, b: int) -> int:
    """Bit-by-bit carry-less product reduced mod P: what gf128.h must compute."""
    product = 0
    for i in range(128):
        if (b >> i) & 1:
            product ^= a << i
    for i in range(254, 127, -1):
        if (product >> i) & 1:
            product ^= P << (i - 128)
    return product


def to_bytes(x: int) -> bytes:
    return x.to_bytes(16, "little")


def from_bytes(b: bytes) -> int:
    return int.from_bytes(b, "little")


def test_gf128_multiply_is_the_field_product():
    rng = np.random.default_rng(46)
    cases = [(1, 1), (1 << 127, 2), ((1 << 128) - 1, (1 << 128) - 1), (0x87, 1 << 127)]
    cases += [(int(rng.integers(0, 2**63)) << 65 | 12345, (1 << 128) - 7) for _ in range(3)]
    cases += [(secrets.randbits(128), secrets.randbits(128)) for _ in range(50)]
    for a, b in cases:
        got = from_bytes(_core._gf128_mul(to_bytes(a), to_bytes(b)))
        assert got == gf_mul_reference(a, b), (hex(a), hex(b))
    # x^127 * x = x^128 = x^7 + x^2 + x + 1
    assert from_bytes(_core._gf128_mul(to_bytes(1 << 127), to_bytes(2))) == 0x87


def run_checked(two_party, m, delta=None, flips=(), guesses=()):
    """(delta, q, labels, choices) of one checked extension, or the sender's exception."""
    tp = two_party()
    choices = np.frombuffer(_core._random_bytes(m // 8), dtype=np.uint8).copy()
    sender = Background(lambda: _core._cot_send(tp.garbler_channel, m, 0, True, delta))
    labels = _core._cot_recv(tp.evaluator_channel, choices, 0, True, list(flips), list(guesses))
    delta_out, q = sender.result()
    return delta_out, q, labels, choices


def delta_with(bits: dict[int, int]) -> bytes:
    """A random Delta (lowest bit set) with the given bits fixed."""
    d = secrets.randbits(128) | 1
    for i, v in bits.items():
        if i == 0:
            continue
        d = d | (1 << i) if v else d & ~(1 << i)
    return to_bytes(d)


@pytest.mark.parametrize("m", [128, 128 * 70])
def test_checked_extension_gives_the_same_correlation(two_party, m):
    tp = two_party()
    choices = np.frombuffer(_core._random_bytes(m // 8), dtype=np.uint8).copy()
    sender = Background(lambda: _core._cot_send(tp.garbler_channel, m, 0, True))
    labels = _core._cot_recv(tp.evaluator_channel, choices, 0, True)
    delta, q = sender.result()
    r = np.unpackbits(choices, bitorder="little").astype(bool)
    want = q.copy()
    want[r] ^= delta[0]
    assert np.array_equal(labels, want)
    # The check costs kKosExtraOts = 256 more OTs of matrix and 32 bytes: nothing per OT.
    sent = tp.evaluator_channel.counters()["ot_extension"]["sent"]
    assert sent == 16 * (m + 256)


def test_a_receiver_with_other_choices_in_one_column_is_caught(two_party):
    """Flip (j, i) with Delta_i = 1: the sender's q_j changes in bit i and the check fails."""
    column = 37
    with pytest.raises(_core.PeerDeviated, match="consistency check"):
        run_checked(two_party, 1024, delta_with({column: 1}), flips=[(5, column)])


def test_the_same_flip_where_delta_is_zero_changes_nothing(two_party):
    """Flip (j, i) with Delta_i = 0 leaves the sender's outputs as they were (the column's
    base OT key does not take u): it passes, and the correlation holds for every OT."""
    column = 37
    delta, q, labels, choices = run_checked(
        two_party, 1024, delta_with({column: 0}), flips=[(5, column)]
    )
    r = np.unpackbits(choices, bitorder="little").astype(bool)
    want = q.copy()
    want[r] ^= delta[0]
    assert np.array_equal(labels, want)


@pytest.mark.parametrize("delta_bit", [0, 1])
def test_an_adapting_receiver_passes_only_when_it_guessed_right(two_party, delta_bit):
    """The leakage KOS prices in: one flipped column, check values fixed for the guess
    Delta_i = 1. It passes exactly when Delta_i is 1 (and so learns one bit with probability
    1/2 of being caught); otherwise it is caught."""
    column = 90  # in the upper half of the block
    delta = delta_with({column: delta_bit})
    if delta_bit:
        run_checked(two_party, 1024, delta, flips=[(700, column)], guesses=[1])
    else:
        with pytest.raises(_core.PeerDeviated):
            run_checked(two_party, 1024, delta, flips=[(700, column)], guesses=[1])


def test_an_adaptive_receiver_after_many_bits_of_delta_is_caught(two_party):
    """40 flipped columns, each with a guess: it must guess all 40 (2^-40). Delta is drawn
    with one of the guessed bits wrong, so the test is deterministic: caught."""
    columns = list(range(3, 123, 3))[:40]
    guesses = [secrets.randbits(1) for _ in columns]
    fixed = dict(zip(columns, guesses, strict=True))
    fixed[columns[17]] = 1 - guesses[17]
    with pytest.raises(_core.PeerDeviated):
        run_checked(
            two_party,
            2048,
            delta_with(fixed),
            flips=[(11 * k, c) for k, c in enumerate(columns)],
            guesses=guesses,
        )


def test_the_padding_ots_are_checked_too(two_party):
    """A flip in one of the 256 padding OTs (dropped after the check) is caught the same way:
    the check covers every row of the matrix."""
    column = 64
    with pytest.raises(_core.PeerDeviated):
        run_checked(two_party, 128, delta_with({column: 1}), flips=[(128 + 200, column)])


def test_a_sender_that_steers_the_coin_is_caught(two_party):
    """chi must be fixed after the receiver's matrix and unbiased by the sender: a sender that
    opens a coin part other than the one it committed to (here one that depends on the
    receiver's part) is refused by the receiver before it sends x and t."""
    tp = two_party()
    m = 256
    choices = np.frombuffer(_core._random_bytes(m // 8), dtype=np.uint8).copy()
    sender = Background(
        lambda: _core._cot_send(tp.garbler_channel, m, 0, True, None, open_another_coin=True)
    )
    with pytest.raises(_core.PeerDeviated, match="does not open its commitment"):
        _core._cot_recv(tp.evaluator_channel, choices, 0, True)
    tp.evaluator_channel.close()  # the sender waits for x and t that never come
    with pytest.raises(_core.ChannelError):
        sender.result()
