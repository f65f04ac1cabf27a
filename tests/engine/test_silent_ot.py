"""Silent correlated OT (Ferret, garbled_core/include/garbled_core/silent_ot.h) through the
Python test hooks: the COT correlation on every output, the bytes after setup against the
parameters' formula, Ferret's published parameter set end to end, and a peer closing
mid-extend as a clean error. Most tests use the TEST-ONLY parameter set (insecure, small)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Background

from garbled_core import ChannelError, PeerClosedError, _core

# SoftSpoken k used for the silent OT's base COTs (silent_ot.cpp) and its chunk count.
SS_K = 7
SS_CHUNKS = -(-128 // SS_K)


def check_correlation(
    delta: np.ndarray, q: np.ndarray, choices: np.ndarray, labels: np.ndarray
) -> None:
    m = len(q)
    assert labels.shape == q.shape == (m, 16)
    assert delta.shape == (1, 16) and delta[0, 0] & 1 == 1
    b = np.unpackbits(choices, bitorder="little")[:m].astype(bool)
    assert not np.unpackbits(choices, bitorder="little")[m:].any()
    # t ^ q == b * Delta, compared as two 64-bit words per label.
    diff = labels.view(np.uint64) ^ q.view(np.uint64)
    assert np.array_equal(diff, np.where(b[:, None], delta.view(np.uint64), np.uint64(0)))
    # The receiver reads its choice bit off its label; the sender's outputs have lsb 0.
    assert np.array_equal(labels[:, 0] & 1, b.astype(np.uint8))
    assert not (q[:, 0] & 1).any()


def run_pair(two_party, m, test_only=True):
    tp = two_party()
    sender = Background(lambda: _core._silent_cot_send(tp.garbler_channel, m, test_only, True))
    choices, labels, rstats = _core._silent_cot_recv(tp.evaluator_channel, m, test_only, True)
    delta, q, sstats = sender.result()
    return delta, q, sstats, choices, labels, rstats


def test_parameter_sets():
    f = _core._silent_ot_params()
    # Ferret (CCS 2020), regular noise: main and setup sets.
    assert (f["main"]["n"], f["main"]["k"], f["main"]["t"], f["main"]["h"]) == (
        10_805_248,
        589_760,
        1_319,
        13,
    )
    assert (f["setup"]["n"], f["setup"]["k"], f["setup"]["t"], f["setup"]["h"]) == (
        642_048,
        19_870,
        2_508,
        8,
    )
    assert f["secure"]
    for s in (f["main"], f["setup"]):
        assert s["n"] == s["t"] << s["h"]
        assert s["tree_bytes"] == s["t"] * (2 * s["h"] + 1) * 16
    assert f["setup"]["n"] >= f["main"]["reserve"] == 589_760 + 1_319 * 13
    assert f["usable_per_iteration"] == 10_805_248 - 606_907
    assert f["bits_per_ot"] == pytest.approx(8 * 569_808 / 10_198_341)
    assert f["bits_per_ot"] < 0.5  # issue 34's target
    t = _core._silent_ot_params(test_only=True)
    assert not t["secure"] and "TEST-ONLY" in t["main"]["name"]


def test_correlation_over_extends_and_iterations(two_party):
    p = _core._silent_ot_params(test_only=True)
    u = p["usable_per_iteration"]
    sizes = [1, 1000, u - 1001, u, 7, 3 * u + 5, 12345]
    delta, q, sstats, choices, labels, rstats = run_pair(two_party, sizes)
    total = sum(sizes)
    check_correlation(delta, q, choices, labels)
    # Distinct sender outputs; successive extends differ.
    assert len(np.unique(q.view(np.dtype((np.void, 16))))) == total
    b = np.unpackbits(choices, bitorder="little")[:total]
    assert abs(b.mean() - 0.5) < 0.01
    # After setup: the receiver sends nothing; the sender one tree message per main iteration.
    iters = -(-total // u)
    assert sstats["iterations"] == rstats["iterations"] == iters
    assert rstats["extend_sent"] == 0 == sstats["extend_received"]
    assert sstats["extend_sent"] == iters * p["main"]["tree_bytes"] == rstats["extend_received"]
    # Setup: Chou-Orlandi (33 B per point), SoftSpoken's GGM sums and random-choice corrections
    # for the base COTs (the silent receiver is SoftSpoken's evaluator), the setup set's trees.
    base = p["base_cots"]
    assert base == -(-(p["setup"]["k"] + p["setup"]["t"] * p["setup"]["h"]) // 128) * 128
    receiver_setup = 33 + 2 * (128 - SS_CHUNKS) * 16 + (SS_CHUNKS - 1) * base // 8
    sender_setup = 128 * 33 + p["setup"]["tree_bytes"]
    assert rstats["setup_sent"] == receiver_setup == sstats["setup_received"]
    assert sstats["setup_sent"] == sender_setup == rstats["setup_received"]


@pytest.mark.parametrize(("sender_threads", "receiver_threads"), [(4, 1), (1, 3), (2, 5)])
def test_threaded_lpn_encoding_is_the_single_threaded_one(
    two_party, sender_threads, receiver_threads
):
    """SilentOtParams.threads splits the LPN encoding over threads (slices of the outputs; each
    output depends on its index alone): a side on one thread and a side on several still hold
    the COT correlation on every output, so both encoded the same linear map bit for bit, over
    extends of every size (a slice boundary anywhere) and several iterations."""
    p = _core._silent_ot_params(test_only=True)
    u = p["usable_per_iteration"]
    sizes = [1, 5000, u - 5001, 3 * u + 5, 4099]
    tp = two_party()
    sender = Background(
        lambda: _core._silent_cot_send(
            tp.garbler_channel, sizes, True, False, threads=sender_threads
        )
    )
    choices, labels = _core._silent_cot_recv(
        tp.evaluator_channel, sizes, True, False, threads=receiver_threads
    )
    delta, q = sender.result()
    check_correlation(delta, q, choices, labels)
    assert len(np.unique(q.view(np.dtype((np.void, 16))))) == sum(sizes)


def test_fresh_sessions_differ(two_party):
    delta1, q1, _, c1, l1, _ = run_pair(two_party, 5000)
    delta2, q2, _, c2, l2, _ = run_pair(two_party, 5000)
    check_correlation(delta1, q1, c1, l1)
    check_correlation(delta2, q2, c2, l2)
    assert not np.array_equal(delta1, delta2)
    assert not np.array_equal(c1, c2)
    assert not (q1 == q2).all(axis=1).any()


def test_ferret_parameters_end_to_end(two_party):
    """Ferret's real (128-bit) set: setup, then a bit more than one main iteration."""
    p = _core._silent_ot_params()
    m = p["usable_per_iteration"] + 1000
    delta, q, sstats, choices, labels, rstats = run_pair(two_party, m, test_only=False)
    check_correlation(delta, q, choices, labels)
    assert sstats["iterations"] == 2
    assert sstats["extend_sent"] == 2 * 569_808 and rstats["extend_sent"] == 0
    b = np.unpackbits(choices, bitorder="little")[:m]
    assert abs(b.mean() - 0.5) < 0.001
    assert sstats["extend_sent"] * 8 / (2 * p["usable_per_iteration"]) == pytest.approx(
        p["bits_per_ot"]
    )


def test_peer_closing_mid_extend_is_a_clean_error(two_party):
    """The sender stops after one main iteration and closes; the receiver, wanting more,
    gets PeerClosedError (a ChannelError), not outputs."""
    tp = two_party()
    u = _core._silent_ot_params(test_only=True)["usable_per_iteration"]
    sender = Background(lambda: _core._silent_cot_send(tp.garbler_channel, 10, True))
    receiver = Background(lambda: _core._silent_cot_recv(tp.evaluator_channel, 3 * u, True))
    _delta, q = sender.result()
    assert q.shape == (10, 16)
    tp.garbler_channel.close()
    with pytest.raises(PeerClosedError) as err:
        receiver.result()
    assert isinstance(err.value, ChannelError)


def test_bad_arguments():
    with pytest.raises(TypeError):
        _core._silent_cot_send(None, 10)


# ---------------------------------------------------------------- the malicious check


def run_malicious(two_party, m, corrupt=-1, test_only=True):
    """Silent COT with Ferret's malicious check (and checked IKNP base COTs); the sender may
    flip a bit of one tree message of its first (setup) iteration. Returns the outputs, or the
    receiver's PeerDeviated."""
    tp = two_party()
    sender = Background(
        lambda: _core._silent_cot_send(
            tp.garbler_channel, m, test_only, True, malicious=True, corrupt=corrupt
        )
    )
    try:
        choices, labels, rstats = _core._silent_cot_recv(
            tp.evaluator_channel, m, test_only, True, malicious=True
        )
    except _core.PeerDeviated as err:
        tp.evaluator_channel.close()
        with pytest.raises(ChannelError):
            sender.result()
        return err
    delta, q, sstats = sender.result()
    return delta, q, sstats, choices, labels, rstats


def test_malicious_check_passes_an_honest_sender_over_iterations(two_party):
    u = _core._silent_ot_params(test_only=True)["usable_per_iteration"]
    delta, q, sstats, choices, labels, rstats = run_malicious(two_party, 2 * u + 100)
    check_correlation(delta, q, choices, labels)
    assert sstats["iterations"] == rstats["iterations"] == 3
    # Per iteration the receiver sends its challenge (chi's seed and X': 32 bytes) and the
    # sender one more SHA-256 (32 bytes) beside its trees.
    assert rstats["extend_sent"] == 3 * 32
    tree_bytes = _core._silent_ot_params(test_only=True)["main"]["tree_bytes"]
    assert sstats["extend_sent"] == 3 * (tree_bytes + 32)


def test_a_sender_whose_last_leaf_correction_is_wrong_is_always_caught(two_party):
    """Message 2h of a tree is c = Delta ^ the sum of the leaves: a wrong c makes the
    receiver's punctured leaf wrong whatever its path."""
    h = 6  # the TEST-ONLY setup set's tree depth (the first iteration the sender runs)
    for tree in (0, 5, 63):
        err = run_malicious(two_party, 1000, corrupt=tree * (2 * h + 1) + 2 * h)
        assert isinstance(err, _core.PeerDeviated), tree
        assert "Ferret's malicious check" in str(err)


def test_a_wrong_level_message_passes_exactly_when_the_path_avoided_it(two_party):
    """A wrong K_0 at level 0 of a tree matters only to a receiver that opens side 0 there:
    the check catches it then, and otherwise the outputs are right (the one bit of the
    punctured path the sender bet on, which Ferret prices into LPN)."""
    outcomes = set()
    for _ in range(12):
        got = run_malicious(two_party, 1000, corrupt=0)
        caught = isinstance(got, _core.PeerDeviated)
        outcomes.add(caught)
        if not caught:
            delta, q, _, choices, labels, _ = got
            check_correlation(delta, q, choices, labels)
    assert outcomes == {True, False}  # both seen (probability 1 - 2^-11)


def test_malicious_ferret_parameters_end_to_end(two_party):
    p = _core._silent_ot_params()
    delta, q, sstats, choices, labels, _ = run_malicious(
        two_party, p["usable_per_iteration"] - 127 + 10, test_only=False
    )
    check_correlation(delta, q, choices, labels)
    assert sstats["iterations"] == 2
