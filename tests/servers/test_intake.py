"""Share intake: every kind of bad submission is refused and leaves the round's sum intact."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from spgc.servers.coordinator import agreement
from spgc.servers.intake import (
    ABORTED,
    ALREADY_EXISTS,
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    ShareIntake,
    SubmissionRejected,
)
from spgc.servers.state import PeerMismatchError
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.chunks import MAX_CHUNK_BYTES, packed_width
from spgc.wire.messages import iter_share_payload, read_share_header, share_messages

DIM, RING = 1000, 32
MASK = np.uint64((1 << RING) - 1)


def random_share(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << RING, DIM, dtype=np.uint64)


def chunks_of(values: np.ndarray, per_chunk: int = 300) -> list[bytes]:
    raw = values.astype("<u8").tobytes()
    return [raw[i : i + 8 * per_chunk] for i in range(0, len(raw), 8 * per_chunk)]


# Shares of DIM values are held in memory by default; 0 bytes in memory spills every share to a
# file (the path of large models). Every intake test runs both ways.
HOLDS = pytest.mark.parametrize("memory_share_bytes", [1 << 16, 0], ids=["memory", "spill"])


@pytest.fixture(params=[1 << 16, 0], ids=["memory", "spill"])
def intake(tmp_path, request):
    it = ShareIntake(
        DIM,
        RING,
        spill_root=tmp_path,
        allowed_providers=["p1", "p2", "p3"],
        memory_share_bytes=request.param,
    )
    assert it.in_memory == (request.param > 0)
    it.open_round(1)
    yield it
    it.close()


def submit(intake, provider, values, round_number=1, sid=None, **kw):
    intake.receive(
        provider,
        round_number,
        sid or os.urandom(16),
        kw.pop("length", DIM),
        kw.pop("ring_bits", RING),
        kw.pop("chunks", None) or chunks_of(values),
        vector_id=kw.pop("vector_id", b""),
    )


def test_sum_of_good_shares_mod_ring(intake):
    shares = {p: random_share(i) for i, p in enumerate(["p1", "p2", "p3"])}
    for p, v in shares.items():
        submit(intake, p, v)
    assert intake.close_round() == {"p1", "p2", "p3"}
    want = (shares["p1"] + shares["p2"] + shares["p3"]) & MASK
    assert np.array_equal(intake.total(), want)


@pytest.mark.parametrize(
    ("kwargs", "code", "message"),
    [
        ({"round_number": 0}, FAILED_PRECONDITION, "round 0 is over"),
        ({"round_number": 2}, FAILED_PRECONDITION, "round 2 is not open"),
        ({"length": DIM - 1}, INVALID_ARGUMENT, "parameters"),
        ({"ring_bits": 16}, INVALID_ARGUMENT, "Z_2\\^16"),
        ({"chunks": [b"\x00" * 12]}, INVALID_ARGUMENT, "whole number"),
        ({"chunks": chunks_of(np.zeros(DIM + 1, np.uint64))}, INVALID_ARGUMENT, "more than"),
        ({"chunks": chunks_of(np.zeros(DIM - 5, np.uint64))}, INVALID_ARGUMENT, "ended after"),
        ({"chunks": chunks_of(np.full(DIM, 1 << RING, np.uint64))}, INVALID_ARGUMENT, "outside"),
        ({"chunks": [b"\x00" * (8 * DIM)]}, RESOURCE_EXHAUSTED, "exceeds the limit"),
        ({"sid": b"x" * 65}, INVALID_ARGUMENT, "submission id"),
    ],
)
@HOLDS
def test_bad_submissions_are_refused_and_the_round_goes_on(
    tmp_path, kwargs, code, message, memory_share_bytes
):
    intake = ShareIntake(
        DIM, RING, spill_root=tmp_path, max_chunk_values=512, memory_share_bytes=memory_share_bytes
    )
    intake.open_round(1)
    good = random_share(1)
    submit(intake, "p1", good)
    with pytest.raises(SubmissionRejected, match=message) as err:
        submit(intake, "p2", random_share(2), **kwargs)
    assert err.value.code == code
    submit(intake, "p3", random_share(3))  # the round goes on
    assert intake.close_round() == {"p1", "p3"}
    assert np.array_equal(intake.total(), (good + random_share(3)) & MASK)
    spilled = 0 if intake.in_memory else 2  # nothing of the refused one is kept
    assert len(list((tmp_path).rglob("*.share"))) == spilled
    intake.close()


def test_duplicates_replays_and_strangers(intake):
    sid = os.urandom(16)
    submit(intake, "p1", random_share(1), sid=sid)
    with pytest.raises(SubmissionRejected) as dup:
        submit(intake, "p1", random_share(2))
    assert dup.value.code == ALREADY_EXISTS
    with pytest.raises(SubmissionRejected) as stranger:
        submit(intake, "mallory", random_share(3))
    assert stranger.value.code == PERMISSION_DENIED
    intake.close_round()
    intake.finish_round()
    intake.open_round(2)
    with pytest.raises(SubmissionRejected, match="replay") as replay:
        submit(intake, "p1", random_share(1), round_number=2, sid=sid)
    assert replay.value.code == ALREADY_EXISTS
    with pytest.raises(SubmissionRejected, match="round 1 is over"):
        submit(intake, "p2", random_share(1), round_number=1)


def test_a_refused_submission_leaves_its_id_free_for_a_retry(intake):
    """A submission refused after admission (here a value outside the ring) counted for
    nothing: the provider's retry with the same id is taken, not answered "already exists"."""
    sid = os.urandom(16)
    bad = random_share(1)
    bad[5] = np.uint64(1 << RING)
    with pytest.raises(SubmissionRejected) as refused:
        submit(intake, "p1", bad, sid=sid)
    assert refused.value.code == INVALID_ARGUMENT
    good = random_share(2)
    submit(intake, "p1", good, sid=sid)
    with pytest.raises(SubmissionRejected, match=r"replay|already sent") as again:
        submit(intake, "p1", good, sid=sid)  # once taken, the id is spent
    assert again.value.code == ALREADY_EXISTS
    assert intake.close_round() == {"p1"}
    assert np.array_equal(intake.total(), good & MASK)


def test_an_upload_still_running_when_the_round_closes_is_cut_at_its_next_chunk(intake):
    submission = intake.begin("p1", 1, os.urandom(16), DIM, RING)
    pieces = chunks_of(random_share(1))
    submission.write(pieces[0])
    intake.close_round()
    with pytest.raises(SubmissionRejected, match="closed before the share was complete") as cut:
        submission.write(pieces[1])
    assert cut.value.code == FAILED_PRECONDITION
    submission.discard()
    assert not np.any(intake.total())


def test_share_that_reached_one_server_only_is_taken_out(intake):
    shares = {p: random_share(10 + i) for i, p in enumerate(["p1", "p2", "p3"])}
    for p, v in shares.items():
        submit(intake, p, v)
    intake.close_round()
    dropped = intake.restrict_to({"p1", "p3"})  # the peer never got p2's share
    assert dropped == {"p2"}
    assert np.array_equal(intake.total(), (shares["p1"] + shares["p3"]) & MASK)


def test_stream_failing_midway_leaves_no_trace(intake):
    def broken():
        yield random_share(5)[:100].tobytes()
        raise ConnectionError("provider went away")

    with pytest.raises(ConnectionError):
        submit(intake, "p2", None, chunks=broken())
    submit(intake, "p2", random_share(6))  # it may try again with a new submission id
    intake.close_round()
    assert np.array_equal(intake.total(), random_share(6))


def test_a_new_submission_supersedes_a_stalled_one(intake, tmp_path):
    """A provider whose upload stalled (its connection lost, the server not yet aware) starts
    again: the new submission counts; the stalled one is refused with ABORTED if it goes on,
    leaves no file, and cannot end the new one's slot; a committed share still refuses more."""
    values = random_share(7)
    stalled = intake.begin("p1", 1, os.urandom(16), DIM, RING)
    stalled.write(chunks_of(values)[0])
    fresh = random_share(8)
    submit(intake, "p1", fresh)  # not ALREADY_EXISTS: the stalled one is not a share yet
    with pytest.raises(SubmissionRejected, match="newer submission") as late:
        stalled.write(chunks_of(values)[1])
    assert late.value.code == ABORTED
    with pytest.raises(SubmissionRejected) as late_commit:
        stalled.commit()
    assert late_commit.value.code == ABORTED
    stalled.discard()
    with pytest.raises(SubmissionRejected) as dup:
        submit(intake, "p1", random_share(9))
    assert dup.value.code == ALREADY_EXISTS
    assert intake.close_round() == {"p1"}
    assert np.array_equal(intake.total(), fresh)
    assert len(list(tmp_path.rglob("*.share"))) == (0 if intake.in_memory else 1)


def test_vector_ids_are_kept_and_another_vectors_half_is_named(intake):
    """Each share's ShareHeader.vector_id is kept for the servers' agreement; a second half of
    ANOTHER vector (a restarted provider, or a twin) is refused saying so."""
    submit(intake, "p1", random_share(3), vector_id=b"a" * 16)
    submit(intake, "p2", random_share(4))
    with pytest.raises(SubmissionRejected, match="ANOTHER vector") as other:
        submit(intake, "p1", random_share(5), vector_id=b"b" * 16)
    assert other.value.code == ALREADY_EXISTS
    with pytest.raises(SubmissionRejected, match="already sent a share for round 1") as same:
        submit(intake, "p1", random_share(3), vector_id=b"a" * 16)
    assert same.value.code == ALREADY_EXISTS
    with pytest.raises(SubmissionRejected, match="vector id must be") as long_id:
        submit(intake, "p3", random_share(6), vector_id=b"x" * 65)
    assert long_id.value.code == INVALID_ARGUMENT
    intake.close_round()
    assert intake.vector_ids() == {"p1": b"a" * 16, "p2": b""}


def test_a_stalled_submission_cannot_free_the_newer_ones_slot(intake):
    first = intake.begin("p2", 1, os.urandom(16), DIM, RING)
    second = intake.begin("p2", 1, os.urandom(16), DIM, RING)
    first.discard()  # the stalled stream ends (idle timeout) while the newer one runs
    for chunk in chunks_of(random_share(10)):
        second.write(chunk)
    second.commit()
    second.discard()
    assert intake.close_round() == {"p2"}
    assert np.array_equal(intake.total(), random_share(10))


def test_concurrent_submissions(intake):
    shares = {p: random_share(20 + i) for i, p in enumerate(["p1", "p2", "p3"])}
    threads = [threading.Thread(target=submit, args=(intake, p, v)) for p, v in shares.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    intake.close_round()
    assert np.array_equal(intake.total(), sum(shares.values()) & MASK)


def test_closed_round_refuses_late_shares(intake):
    intake.close_round()
    with pytest.raises(SubmissionRejected, match="no round is open") as err:
        submit(intake, "p1", random_share(1))
    assert err.value.code == FAILED_PRECONDITION


def test_an_abandoned_round_drops_its_shares_and_opens_again(intake, tmp_path):
    """The peer server was lost mid-round: the round's shares are dropped (files too) and the
    same round opens again empty; a submission id used before stays spent (no replay)."""
    sid = os.urandom(16)
    submit(intake, "p1", random_share(1), sid=sid)
    submit(intake, "p2", random_share(2))
    intake.abandon_round(1)
    assert not list(tmp_path.glob("spgc-intake-*/round-1/*"))
    with pytest.raises(SubmissionRejected) as refused:
        submit(intake, "p3", random_share(3))
    assert refused.value.code == FAILED_PRECONDITION  # nothing is open until the round reopens
    intake.open_round(1)
    with pytest.raises(SubmissionRejected) as replay:
        submit(intake, "p1", random_share(1), sid=sid)
    assert replay.value.code == ALREADY_EXISTS
    fresh = random_share(4)
    submit(intake, "p1", fresh)
    assert intake.close_round() == {"p1"}
    assert np.array_equal(intake.total(), fresh & MASK)


def test_memory_for_a_round_is_bounded_the_rest_is_spilled(tmp_path):
    """Two shares fit the round's memory, the third goes to a spill file; a refused share
    gives its room back; the sum is the same either way."""
    intake = ShareIntake(DIM, RING, spill_root=tmp_path, memory_round_bytes=2 * 8 * DIM)
    intake.open_round(1)
    with pytest.raises(SubmissionRejected):
        submit(intake, "p1", None, chunks=[b"\x00" * 12])  # refused: its room is free again
    shares = {p: random_share(30 + i) for i, p in enumerate(["p1", "p2", "p3"])}
    for p, v in shares.items():
        submit(intake, p, v)
    assert len(list(tmp_path.rglob("*.share"))) == 1  # the third share only
    intake.close_round()
    assert np.array_equal(intake.total(), sum(shares.values()) & MASK)
    intake.close()


@pytest.mark.parametrize(
    ("own_ids", "other_ids", "agreed", "mismatched"),
    [
        ([b"a", b"b", b"c"], [b"b", b"c"], ["p2", "p3"], []),  # p1 one-sided; the rest match
        ([b"a", b"x", b"c"], [b"b", b"c"], ["p3"], ["p2"]),  # p2: halves of two vectors
        ([b"a", b"", b"c"], [b"b", b"c"], ["p3"], ["p2"]),  # an id on one side only: differ
        ([b"a", b"", b"c"], [b"", b"c"], ["p2", "p3"], []),  # no id on either side: unchecked
        ([], [b"z", b"c"], ["p2", "p3"], []),  # a sender that predates vector ids
    ],
)
def test_agreement_leaves_out_halves_of_different_vectors(own_ids, other_ids, agreed, mismatched):
    """P_t as both servers compute it (servers.coordinator.agreement), from each one's set."""
    own, other = ["p1", "p2", "p3"], ["p2", "p3"]
    got = agreement(own, other, 1, own_ids, other_ids)
    assert (got[0], got[2], got[3]) == (agreed, True, mismatched)
    swapped = agreement(other, own, 1, other_ids, own_ids)  # the other server's view
    assert swapped[:3] == got[:3]
    with pytest.raises(PeerMismatchError):
        agreement(own, other, 1, [b"a"], other_ids)  # ids that do not match the list


@pytest.mark.parametrize("ring_bits", [8, 16, 24])
def test_a_full_packed_wire_chunk_fits_the_intake_once_widened(tmp_path, ring_bits):
    """Packed chunks reach the intake widened to 8 bytes a value: a wire chunk of the largest
    size (1 MiB) at width 1, 2 or 3 bytes is 8/3 to 8 MiB there, and must be taken (the
    intake once compared it with the wire's byte limit: every model above 131,072
    parameters was refused)."""
    width = packed_width(ring_bits)
    dim = MAX_CHUNK_BYTES // width + 5  # one full chunk and a short one
    values = np.random.default_rng(ring_bits).integers(0, 1 << ring_bits, dim, dtype=np.uint64)
    messages = share_messages(
        values, run_id="r", round_number=1, server_role=pb.SERVER_ROLE_H1, ring_bits=ring_bits,
        submission_id=os.urandom(16), chunk_bytes=MAX_CHUNK_BYTES,
        encoding=pb.SHARE_ENCODING_PACKED,
    )  # fmt: skip
    header = read_share_header(messages, num_elements=dim, ring_bits=ring_bits)
    intake = ShareIntake(dim, ring_bits, spill_root=tmp_path, memory_share_bytes=0)
    intake.open_round(1)
    try:
        submission = intake.begin("p1", 1, header.submission_id, dim, ring_bits)
        for chunk in iter_share_payload(messages, header):
            submission.write(chunk)
        submission.commit()
        assert intake.close_round() == {"p1"}
        assert np.array_equal(intake.total(), values)
    finally:
        intake.close()
