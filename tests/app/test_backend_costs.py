"""backend: auto's table of costs (spgc.settings.backend_choice) against the engine now: the
bytes per coordinate and round trips that `spgc bench comm` measures for each backend must
stay within 10% of the table, else the table is stale (re-measure with COSTS_COMMAND). The
CPU figures depend on the machine and are not checked here."""

from __future__ import annotations

import json

import pytest

from spgc.app import bench_comm
from spgc.servers.pool_sync import GC_TRIPS_PER_STAGE
from spgc.settings.backend_choice import (
    COSTS_COMMAND,
    GMW_DEPTH_COSTS,
    MALICIOUS_COSTS_COMMAND,
    MALICIOUS_NOISE_COSTS,
    MALICIOUS_ROUND_COSTS,
    NOISE_COSTS,
    ROUND_COSTS,
)

TOLERANCE = 0.10


def _stale(what: str, measured: float, table: float) -> str:
    return f"{what}: measured {measured:,.1f}, table {table:,.1f}: re-measure with {COSTS_COMMAND}"


@pytest.mark.parametrize("backend", ["gc", "gmw"])
def test_the_cost_table_matches_what_the_engine_measures(backend, capsys):
    code = bench_comm.run(
        "mnist", [2.0], modes=["spgc", "preprocessed"], coordinates=400, backend=backend,
        as_json=True,
    )  # fmt: skip
    assert code == 0
    rows = {row["mode"]: row for row in json.loads(capsys.readouterr().out)}
    checks = [
        ("round bytes per coordinate", rows["spgc"]["bytes_per_coordinate"],
         ROUND_COSTS[backend].bytes_per_coordinate),
        ("noise bytes per sample", rows["preprocessed"]["offline_bytes_per_coordinate"],
         NOISE_COSTS[backend].bytes_per_coordinate),
    ]  # fmt: skip
    for what, measured, table in checks:
        stale = _stale(f"{backend} {what}", measured, table)
        assert abs(measured - table) <= TOLERANCE * table, stale
    table = ROUND_COSTS[backend].round_trips
    if backend == "gmw":  # the engine counts them; the table's are a one-stage round's (its
        # spare trials make one stage almost always enough: a rare second one repeats them)
        trips = rows["spgc"]["round_trips"] / rows["spgc"]["rounds"]
        assert abs(trips - table) <= TOLERANCE * table, _stale("gmw round trips", trips, table)
    else:
        # Two per sampler stage (the table's note); the stages a run needs vary with its draws
        # (2 or 3 at this sample): one stage either way.
        trips = GC_TRIPS_PER_STAGE * rows["spgc"]["rounds"]
        assert abs(trips - table) <= GC_TRIPS_PER_STAGE, _stale("gc round trips", trips, table)


@pytest.mark.parametrize("depth", sorted(GMW_DEPTH_COSTS))
def test_gmws_rows_per_trial_depth_match_what_the_engine_measures(depth, capsys):
    code = bench_comm.run(
        "mnist", [2.0], modes=["spgc"], coordinates=400, backend="gmw", trial_depth=depth,
        as_json=True,
    )  # fmt: skip
    assert code == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["trial_depth"] == depth
    table = GMW_DEPTH_COSTS[depth]
    measured = row["bytes_per_coordinate"]
    stale = _stale(
        f"gmw depth {depth} round bytes per coordinate", measured, table.bytes_per_coordinate
    )
    assert abs(measured - table.bytes_per_coordinate) <= TOLERANCE * table.bytes_per_coordinate, (
        stale
    )
    trips = row["round_trips"] / row["rounds"]
    stale = _stale(f"gmw depth {depth} round trips", trips, table.round_trips)
    assert abs(trips - table.round_trips) <= TOLERANCE * table.round_trips, stale


#: The malicious rows grow with the run (the table's note): checked at half the table's run.
MALICIOUS_CHECK_COORDINATES = 4000
#: Round trips at another size than the table's: the triples' stock makes them vary more.
MALICIOUS_TRIP_TOLERANCE = 0.20


@pytest.mark.parametrize("backend", ["gc", "gmw"])
def test_the_malicious_cost_table_matches_what_the_authenticated_engines_measure(backend, capsys):
    code = bench_comm.run(
        "mnist", [2.0], modes=["spgc", "preprocessed"], coordinates=MALICIOUS_CHECK_COORDINATES,
        backend=backend, security="malicious", as_json=True,
    )  # fmt: skip
    assert code == 0
    rows = {row["mode"]: row for row in json.loads(capsys.readouterr().out)}
    assert {row["security"] for row in rows.values()} == {"malicious"}

    def stale(what: str, measured: float, table: float) -> str:
        return (
            f"malicious {backend} {what}: measured {measured:,.1f}, table {table:,.1f}: "
            f"re-measure with {MALICIOUS_COSTS_COMMAND}"
        )

    round_cost, noise_cost = MALICIOUS_ROUND_COSTS[backend], MALICIOUS_NOISE_COSTS[backend]
    checks = [
        ("round bytes per coordinate", rows["spgc"]["bytes_per_coordinate"],
         round_cost.bytes_per_coordinate),
        ("noise bytes per sample", rows["preprocessed"]["offline_bytes_per_coordinate"],
         noise_cost.bytes_per_coordinate),
    ]  # fmt: skip
    for what, measured, table in checks:
        assert abs(measured - table) <= TOLERANCE * table, stale(what, measured, table)
    trips = rows["spgc"]["round_trips"] / rows["spgc"]["rounds"]
    table = round_cost.round_trips + MALICIOUS_CHECK_COORDINATES * (
        round_cost.round_trips_per_coordinate
    )
    within = abs(trips - table) <= MALICIOUS_TRIP_TOLERANCE * table
    assert within, stale("round trips", trips, table)
