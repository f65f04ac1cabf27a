"""Lanes: one batch of coordinates split into contiguous ranges, each run on its own engine
session (its own data connection, OT extension, garbling and TLS stream) in its own thread.

Nothing is shared between lanes but the Python orchestration (the engine releases the GIL while
it computes or waits), so a server with T cores runs T lanes without a single-threaded stage on
the hot path. Lane i always takes the same range of a batch on both servers, and the noise of a
coordinate depends only on the round seeds and its own index (:mod:`spgc.privacy.noise`), so the
released vector is the same for any number of lanes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["MAX_LANES", "lane_ranges", "run_lanes"]

MAX_LANES = 64

T = TypeVar("T")


def lane_ranges(n: int, lanes: int, align: int = 1) -> list[tuple[int, int]]:
    """``lanes`` contiguous ``[start, stop)`` ranges covering ``0..n``, sizes differing by at
    most one (a lane may be empty when n < lanes); with ``align`` > 1 every split is moved up
    to a multiple of ``align`` (the sampler's spare groups), so sizes differ by up to align."""
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes must be in 1..{MAX_LANES}, got {lanes}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if align < 1:
        raise ValueError(f"align must be >= 1, got {align}")
    cuts = [min(n, -(-(n * i // lanes) // align) * align) for i in range(lanes)] + [n]
    return [(cuts[i], cuts[i + 1]) for i in range(lanes)]


def run_lanes(
    tasks: Sequence[Callable[[], T]], on_failure: Callable[[int], None] | None = None
) -> list[T]:
    """Run each task in its own thread (the first in the caller's) and return their results in
    order. When one raises, ``on_failure(i)`` is called for every other lane i still running
    (so its blocked I/O fails instead of waiting for a peer that will not answer), all lanes
    are joined, and the first exception raised (in time) is raised."""
    results: list[T | None] = [None] * len(tasks)
    errors: list[BaseException | None] = [None] * len(tasks)
    done = [False] * len(tasks)
    lock = threading.Lock()
    failed = False
    first_error: list[BaseException] = []

    def run(i: int) -> None:
        nonlocal failed
        try:
            results[i] = tasks[i]()
        except BaseException as exc:  # re-raised in the caller below
            errors[i] = exc
            with lock:
                first = not failed
                failed = True
                if first:
                    first_error.append(exc)
                done[i] = True
                others = [j for j in range(len(tasks)) if not done[j]]
            if first and on_failure is not None:
                for j in others:
                    # best effort: a lane that cannot be interrupted fails on its own
                    with contextlib.suppress(Exception):
                        on_failure(j)
            return
        with lock:
            done[i] = True

    threads = [
        threading.Thread(target=run, args=(i,), name=f"spgc-lane-{i}", daemon=True)
        for i in range(1, len(tasks))
    ]
    for t in threads:
        t.start()
    if tasks:
        run(0)
    for t in threads:
        t.join()
    if first_error:  # the cause; the others' errors are mostly its consequences
        raise first_error[0]
    return results  # type: ignore[return-value]
