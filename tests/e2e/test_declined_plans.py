"""Providers that decline the plan (DeclinePlan): the servers' wait for providers and their
rounds count them out, and a run that can never have min_providers providers ends at once,
naming each decliner and its reason (the servers' classes, without a network)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from spgc.servers.coordinator import SingleDriver, wait_for_providers
from spgc.servers.intake import ShareIntake
from spgc.servers.state import ServerState
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import aggregation_pb2 as pb

PROVIDERS = ["p1", "p2", "p3"]
SPENT = "this data set has spent epsilon 8 over 1 earlier run(s): 16 > max_total_epsilon 10"


def _state(tmp_path: Path) -> ServerState:
    """One server (mode plain), three providers, min_providers 2, a first-round wait of 300 s
    (the examples')."""
    cfg = ServerConfig(role=1, mode="plain", insecure=True, providers=PROVIDERS, dataset="cancer",
                       max_batch_size=40, rounds=2, min_providers=2, first_round_wait=300.0,
                       round_deadline=120.0)  # fmt: skip
    plan = make_plan(cfg)
    intake = ShareIntake(plan.dim, plan.ring_bits, tmp_path)
    state = ServerState(plan, pb.SERVER_ROLE_SINGLE, intake)
    state.run_id = "run"
    return state


def _in_thread(target: Any) -> threading.Thread:
    """``target`` run in a thread, joined for at most 10 s (far below the 300 s wait)."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(10)
    return thread


def test_declines_that_leave_too_few_providers_end_the_run_at_once(tmp_path: Path) -> None:
    state = _state(tmp_path)
    audited: list[tuple[str, dict[str, Any]]] = []
    state.audit.add_listener(lambda event, entry: audited.append((event, entry)))
    state.note_caller("p2")
    state.note_declined("p2", SPENT)
    state.note_caller("p1")
    state.note_caller("p3")
    assert state.too_few_accepted() is None  # p1 and p3 remain: 2
    state.note_declined("p3", "accepts only the modes dng")
    stop = threading.Event()
    assert not _in_thread(SingleDriver(state, stop).run).is_alive()
    assert state.failure == (
        "round 0 cannot open: 2 of the plan's 3 providers declined it, leaving 1 (p1) < "
        f"min_providers=2: p2: {SPENT}; p3: accepts only the modes dng"
    )
    assert state.finished and 0 not in state.history  # no round was opened
    (entry,) = [x for e, x in audited if e == "providers_declined"]
    assert entry["round"] == 0 and "p2: this data set has spent" in entry["reason"]


def test_the_wait_goes_on_while_a_provider_has_not_called(tmp_path: Path) -> None:
    """Two of three declined, the third has not called yet: it may still join, so the wait
    goes on (ended here by ``stop``); once it calls, the run ends."""
    state = _state(tmp_path)
    for name in ("p1", "p2"):
        state.note_caller(name)
        state.note_declined(name, "no")
    assert state.too_few_accepted() is None
    stop = threading.Event()
    waiting = threading.Thread(target=wait_for_providers, args=(state, stop), daemon=True)
    waiting.start()
    state.note_caller("p3")
    waiting.join(10)
    assert not waiting.is_alive()
    assert state.too_few_accepted() == (
        "2 of the plan's 3 providers declined it, leaving 1 (p3) < min_providers=2: p1: no; p2: no"
    )


def test_enough_providers_left_go_on_without_the_decliners(tmp_path: Path) -> None:
    """p1 declined; p2 and p3 joined: round 0 opens without waiting, its intake closes once
    their shares are in (not at the deadline, 120 s away), and p1 is left out as a decliner."""
    state = _state(tmp_path)
    for name in PROVIDERS:
        state.note_caller(name)
    state.note_declined("p1", SPENT)
    assert not _in_thread(lambda: wait_for_providers(state, threading.Event())).is_alive()
    assert state.too_few_accepted() is None
    state.open_round(0)
    for name in ("p2", "p3"):
        assert not state.intake_complete(0)
        state.note_accepted(0, name, "uint64", 8)
    assert state.intake_complete(0)
    state.close_intake(0)
    state.set_agreed(0, [], False, "test")
    assert state.history[0].left_out["p1"] == f"it declined the plan: {SPENT}"


def test_a_provider_that_says_hello_again_is_no_longer_counted_out(tmp_path: Path) -> None:
    """A provider restarted after declining (its budget raised) tries again: its Hello clears
    the decline, so the run neither ends for it nor closes rounds without it."""
    state = _state(tmp_path)
    for name in PROVIDERS:
        state.note_caller(name)
        state.note_declined(name, "no")
    assert state.too_few_accepted() is not None
    state.note_hello("p1")
    state.note_hello("p2")
    assert state.too_few_accepted() is None
    assert state.providers_present() == ["p1", "p2"]
    assert state.declined_text() == "p3: no"


@pytest.mark.parametrize("declined", [[], ["p1"]])
def test_nobody_declined_or_enough_remain_the_wait_is_not_ended(
    tmp_path: Path, declined: list[str]
) -> None:
    state = _state(tmp_path)
    for name in PROVIDERS:
        state.note_caller(name)
    for name in declined:
        state.note_declined(name, "no")
    assert state.too_few_accepted() is None
