"""`spgc bench load`, small: both server daemons, three providers in one worker process, two
quiet rounds and two rounds with one hostile actor of each kind."""

from __future__ import annotations

import pytest

from spgc.app.bench_load import LoadOptions, main, run_bench
from spgc.app.cheating_provers import CHEATS, EXPECTED_REFUSAL

REFUSALS = {
    "silent_streams": {"PERMISSION_DENIED"},  # the intruder's certificate: not a provider
    "slow_streams": {"PERMISSION_DENIED"},
    "malformed_as_intruder": {"PERMISSION_DENIED"},
    "malformed_as_provider": {"INVALID_ARGUMENT"},  # a provider's bytes that do not parse
    # the circuit port is closed once the servers are linked
    "gc_port_junk": {"connection_refused", "closed_by_server", "reset_by_server"},
}


def test_bench_load_small_run_with_hostile_actors_and_poisoning_providers():
    # Verified inputs; providers p4 and p5 cheat the norm proof in every round, the six cheating
    # provers in turn (rounds 1 to 3 alone try all six): none may enter a sum.
    opts = LoadOptions(
        providers=5, rounds=2, hostile=1, processes=1, hostile_interval=0.1, poison=2,
        verify_inputs="l2",
    )  # fmt: skip
    # 1.5 GB held here while the servers run: a server's peak RSS is its own, not the memory of
    # the process it was forked from (the kernel's ru_maxrss counts that; a CI run once read a
    # 4.2 GB "server" this way).
    ballast = bytearray(1536 << 20)
    ballast[:: 1 << 12] = b"\x01" * len(range(0, len(ballast), 1 << 12))
    result = run_bench(opts, progress=None)
    del ballast
    assert result["verify_inputs"] == "l2" and result["poison"] == 2
    assert result["poison_attempts"] >= 2 * (opts.total_rounds - 1)  # round 0: maybe late
    assert result["poison_accepted"] == 0
    assert result["poison_refused"] == result["poison_attempts"]
    # and each poisoner was told why, round by round (RoundInfo.caller_left_out)
    assert result["poison_told_refused"] == result["poison_refused"]
    # and both servers audited each refusal (what the refusal metric counts)
    assert result["poison_audited"] == {
        "h1": result["poison_refused"],
        "h2": result["poison_refused"],
    }
    # every cheating prover went through the real daemons, each refused for its reason
    kinds = result["poison_kinds"]
    assert set(kinds) == set(CHEATS)
    for kind, tally in kinds.items():
        assert tally["attempts"] >= 1 and tally["accepted"] == 0, (kind, tally)
        assert tally["reasons"] == {EXPECTED_REFUSAL[kind]: tally["attempts"]}, (kind, tally)
    for key in (
        "providers",
        "rounds",
        "median_round_seconds",
        "p95_round_seconds",
        "missed_providers",
        "rss_mb_max",
        "rss_mb",
        "cpu_seconds",
        "wall_seconds",
        "hostile_median_round_seconds",
        "hostile_p95_round_seconds",
        "hostile_missed_providers",
        "hostile_calls",
    ):
        assert key in result, key
    assert result["providers"] == 5 and result["providers_connected"] == 5
    assert result["rounds"] == 2 and result["hostile_rounds"] == 2
    assert result["missed_providers"] == 0 and result["hostile_missed_providers"] == 0
    assert result["servers_alive"] and result["servers_exit_codes"] == {"h1": 0, "h2": 0}
    assert 0 < result["median_round_seconds"] <= result["p95_round_seconds"] < 30
    assert 0 < result["hostile_median_round_seconds"] < 30
    assert result["parameters"] == 62  # the cancer model's d
    for server in ("h1", "h2"):
        assert 50 < result["rss_mb"][server] < 1200  # about 420 MB on cancer
        assert result["cpu_seconds"][server] > 0
    assert result["rss_mb_max"] == max(result["rss_mb"].values())
    assert result["wall_seconds"] > 0
    # every hostile call was refused, each the way it should be
    calls = result["hostile_calls"]
    assert result["hostile_calls_total"] > 0 and result["hostile_calls_answered_ok"] == 0
    # the measured rounds wait for every actor's first call (silent stream, junk, malformed
    # as a provider), however short the rounds are (these take about 0.05 s)
    assert {"silent_streams", "gc_port_junk", "malformed_as_provider"} <= set(calls), calls
    for kind, outcomes in calls.items():
        if kind != "after_last_round":  # the servers were stopping: anything goes
            # UNAVAILABLE: the actor's own connection not set up in time on a busy machine;
            # CANCELLED: a call the servers' shutdown cut, when they finished before the bench
            # told the actors to stop (never an acceptance: answered_ok is 0 above)
            allowed = REFUSALS[kind] | {"UNAVAILABLE", "CANCELLED"}
            assert set(outcomes) <= allowed, (kind, outcomes)
    assert calls["malformed_as_provider"].get("INVALID_ARGUMENT", 0) > 0


def test_bench_load_refuses_bad_options_cleanly(capsys):
    assert main(["--providers", "0", "--json"]) == 2
    assert main(["--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert "--providers must be in 1..100000" in err and "--rounds must be >= 1" in err
    assert "Traceback" not in err
    with pytest.raises(ValueError, match="two-server mode"):
        run_bench(LoadOptions(mode="plain"), progress=None)  # one server: no pair to load
    with pytest.raises(ValueError, match="needs verified inputs"):
        run_bench(LoadOptions(providers=4, poison=1, verify_inputs="none"), progress=None)
    assert main(["--providers", "3", "--poison", "3"]) == 2
    assert "--poison must be in 0..N-1" in capsys.readouterr().err
