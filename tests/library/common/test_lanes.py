"""spgc.common.lanes: contiguous ranges, one thread per lane, a failing lane interrupts the
others."""

from __future__ import annotations

import itertools
import threading

import pytest

from spgc.common.lanes import lane_ranges, run_lanes


@pytest.mark.parametrize(("n", "lanes"), [(0, 3), (2, 3), (10, 1), (10, 3), (1001, 7)])
def test_ranges_cover_the_batch_in_order(n: int, lanes: int) -> None:
    ranges = lane_ranges(n, lanes)
    assert len(ranges) == lanes and ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("n", "lanes", "align"), [(0, 3, 8), (5, 3, 8), (100, 3, 8), (4096, 4, 1024)]
)
def test_aligned_ranges_split_only_at_multiples(n: int, lanes: int, align: int) -> None:
    """With ``align`` (the gmw sampler's spare groups) every split is a multiple of it and the
    ranges still cover the batch in order."""
    ranges = lane_ranges(n, lanes, align)
    assert len(ranges) == lanes and ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert all(lo % align == 0 or lo == n for lo, _ in ranges)
    assert max(hi - lo for lo, hi in ranges) <= -(-n // lanes) + align


def test_bad_lane_counts_are_refused() -> None:
    with pytest.raises(ValueError, match=r"lanes must be in 1\.\.64"):
        lane_ranges(10, 0)
    with pytest.raises(ValueError, match=r"lanes must be in 1\.\.64"):
        lane_ranges(10, 65)


def test_results_in_order_each_lane_on_its_own_thread() -> None:
    names = run_lanes([lambda i=i: (i, threading.current_thread().name) for i in range(4)])
    assert [i for i, _ in names] == [0, 1, 2, 3]
    assert len({name for _, name in names}) == 4


def test_a_failing_lane_interrupts_the_others_and_its_error_is_raised() -> None:
    release = [threading.Event() for _ in range(3)]
    interrupted: list[int] = []

    def blocked(i: int) -> int:
        if not release[i].wait(10):
            raise TimeoutError("never interrupted")
        raise ConnectionError(f"lane {i} interrupted")

    def fail() -> int:
        raise ValueError("lane 1 broke")

    def interrupt(i: int) -> None:
        interrupted.append(i)
        release[i].set()

    with pytest.raises(ValueError, match="lane 1 broke"):
        run_lanes([lambda: blocked(0), fail, lambda: blocked(2)], on_failure=interrupt)
    assert sorted(interrupted) == [0, 2]
