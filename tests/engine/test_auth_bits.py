"""Authenticated XOR shares of bits (auth_bits.h): layer 2 of docs/MALICIOUS.md, its linear
part. Two parties make random shares from checked IKNP in both directions, open them with the
MAC check, and compute XORs with each other and with public bits locally. A party that opens a
flipped bit is caught unless it also knows the other party's Delta: the test that hands it that
Delta passes (the control), which shows that the MAC, and nothing else, stops it.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest
from helpers import Background

from garbled_core import _core

N = 300  # not a multiple of 128: the COTs are padded and the padding dropped


def session(two_party, public):
    """Both honest parties' results."""
    tp = two_party()
    other = Background(lambda: _core._auth_bits_session(tp.evaluator_channel, False, N, public))
    first = _core._auth_bits_session(tp.garbler_channel, True, N, public)
    return first, other.result()


def cheat(two_party, flip_at, offset_of=None):
    """The first party deviates in r's opening; the honest second party must refuse it.
    offset_of() gives the MAC offset the cheater XORs in (None: none)."""
    tp = two_party()
    offset = offset_of() if offset_of else None
    cheater = Background(
        lambda: _core._auth_bits_session(
            tp.garbler_channel, True, N, public_bits(), flip_at, offset
        )
    )
    with pytest.raises(_core.PeerDeviated, match="MACs do not hold"):
        _core._auth_bits_session(tp.evaluator_channel, False, N, public_bits())
    tp.evaluator_channel.close()  # the cheater waits for an opening that never comes
    with pytest.raises(_core.ChannelError):
        cheater.result()


def public_bits():
    return [int(b) for b in np.frombuffer(_core._random_bytes(N), dtype=np.uint8) & 1]


def test_opened_values_are_the_xor_of_the_shares_and_linear_ops_hold(two_party):
    public = public_bits()
    a, b = session(two_party, public)
    assert a["r"] == b["r"]
    assert a["r"] == [x ^ y for x, y in zip(a["own_bits"], b["own_bits"], strict=True)]
    assert (
        a["r_xor_public"]
        == b["r_xor_public"]
        == [r ^ c for r, c in zip(a["r"], public, strict=True)]
    )
    assert a["r_xor_r2"] == b["r_xor_r2"]
    assert a["public"] == b["public"] == public
    # Each party's own bits are its COT choices: uniform, and not the value.
    assert 0 < sum(a["own_bits"]) < N and a["own_bits"] != a["r"]
    assert a["delta"] != b["delta"] and a["delta"][0] & 1 and b["delta"][0] & 1


@pytest.mark.parametrize("index", [0, 137, N - 1])
def test_a_party_that_opens_a_flipped_bit_is_caught(two_party, index):
    cheat(two_party, index)


def test_a_flipped_bit_with_a_guessed_mac_is_caught(two_party):
    """The cheater XORs a guess of the other's Delta into its MAC: right with probability
    2^-127; a fresh random guess (lowest bit set, as Delta's is) is caught."""
    guess = bytearray(secrets.token_bytes(16))
    guess[0] |= 1
    cheat(two_party, 42, offset_of=lambda: bytes(guess))


def test_a_cheater_who_knows_the_other_delta_passes(two_party):
    """The control: the same flip with the MAC moved by the honest party's true Delta (which
    the test hands the cheater) is accepted, and the honest party opens the flipped value. So
    the MAC is what catches the cheats above, and only 2^-127 separates them from this one."""
    tp = two_party()
    delta = bytearray(secrets.token_bytes(16))
    delta[0] |= 1
    public = public_bits()
    cheater = Background(
        lambda: _core._auth_bits_session(tp.garbler_channel, True, N, public, 42, bytes(delta))
    )
    honest = _core._auth_bits_session(tp.evaluator_channel, False, N, public, delta=bytes(delta))
    lied = cheater.result()
    assert honest["r"][42] != lied["r"][42]  # the honest party took the flipped bit
    assert honest["r"][:42] == lied["r"][:42] and honest["r"][43:] == lied["r"][43:]
