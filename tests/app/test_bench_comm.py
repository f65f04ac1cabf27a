"""`spgc bench comm`: measured bytes match the engine's closed forms, dng is 16 B per coordinate,
spgc's per-coordinate cost does not depend on the sample size, and the output formats."""

from __future__ import annotations

import json
import math

import pytest

from garbled_core import AUTH_TABLE_BYTES, DEFAULT_CHUNK, DEFAULT_OT_K, and_table_bytes
from garbled_core.discrete_gaussian import MAX_TRIAL_DEPTH, build_trial_circuit, derive_params
from spgc.app import bench_comm, bench_comm_charges, bench_comm_cli, cli
from spgc.app.bench_sampler import party_links
from spgc.servers.spgc_circuit import (
    noisy_sum_circuit,
    reconstruct_circuit,
)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# SoftSpoken at the engine's default k: one correction bit per chunk of Delta per OT
# (k = 7: 19 bits), after 2 * (128 - chunks) blocks of GGM level sums at setup
DELTA_CHUNKS = ceil_div(128, DEFAULT_OT_K)


def only_mpc_closed_form(
    ring_bits: int, n: int, chunk: int = DEFAULT_CHUNK, ands: int | None = None, flags: int = 0
) -> dict[str, int]:
    """docs/ENGINE.md: per chunk of n_c instances, the evaluator sends ceil(128 / k) bits per OT
    (its L input bits, padded to 128 OTs), the garbler three-halves tables (24 B and 5 bits per
    AND, a gate's bits padded to a byte per chunk); each side 1 bit per revealed output bit (L
    bits revealed to both), padded to whole bytes; 80-byte run header each way. ``flags``: more
    evaluator input bits per instance (verified inputs: 1), ``ands``: another AND count."""
    ands = ring_bits - 1 if ands is None else ands
    chunks = [min(chunk, n - s) for s in range(0, n, chunk)]
    bits = ring_bits + flags
    return {
        "run_headers": 2 * 80,
        "ot_extension": sum(DELTA_CHUNKS * ceil_div(bits * c, 128) * 128 // 8 for c in chunks),
        "tables": sum(ands * and_table_bytes("threehalves", c) for c in chunks),
        "outputs": sum(2 * ring_bits * ceil_div(c, 8) for c in chunks),
    }


@pytest.fixture(scope="module")
def ctx():
    c = bench_comm.make_context("cancer")
    c.links = party_links(None, None)
    bench_comm._warm_up(c)
    yield c
    for link in c.links:
        link.channel.close()


def test_context_matches_the_daemon_defaults(ctx) -> None:
    from spgc.protocol.encoding import FixedPointConfig
    from spgc.settings.config import ServerConfig

    cfg = ServerConfig.model_construct()
    assert ctx.dim == 62 and ctx.scale == cfg.scale and ctx.clip_norm == cfg.clip_norm
    fp = FixedPointConfig(scale=cfg.scale, clip_norm=cfg.clip_norm, dim=62)
    assert ctx.l2_bound_units == fp.l2_bound_units
    # 3 providers x batch 10 x B fits in L bits, signed, and L is the smallest such
    assert ctx.max_abs_sum == 30 * fp.l2_bound_units
    assert ctx.max_abs_sum < 2 ** (ctx.ring_bits - 1) and ctx.max_abs_sum >= 2 ** (
        ctx.ring_bits - 2
    )
    # the session setup (hello, session keys, 128 base OTs) is measured once, apart
    # hello (role, version, scheme, ot_k), session keys, base OTs, SoftSpoken GGM sums
    assert ctx.session_setup_bytes == 2 * 20 + 56 + 33 + 4224 + 2 * (128 - DELTA_CHUNKS) * 16


@pytest.mark.parametrize("n", [1024, 1500])
def test_only_mpc_bytes_equal_the_engine_closed_form(ctx, n: int) -> None:
    m = bench_comm.MODES["only-mpc"].measure(ctx, 0.0, n)
    assert reconstruct_circuit(ctx.ring_bits).and_count == ctx.ring_bits - 1
    assert m.and_gates == ctx.ring_bits - 1
    assert m.phases == only_mpc_closed_form(ctx.ring_bits, n)


def test_verified_inputs_cost_a_flag_bit_each_and_three_and_gates_in_the_noisy_sum(ctx) -> None:
    params = bench_comm.verified_field(ctx)
    assert params.p > 1 << ctx.ring_bits and params.soundness_error <= 2.0**-40
    ctx.field_modulus = params.p
    try:
        m = bench_comm.MODES["only-mpc"].measure(ctx, 0.0, 1024)
    finally:
        ctx.field_modulus = None
    ands = reconstruct_circuit(ctx.ring_bits, field=True).and_count
    assert m.and_gates == ands == 2 * ctx.ring_bits + 1  # L + 2 ORs + an L-bit increment
    assert m.phases == only_mpc_closed_form(ctx.ring_bits, 1024, ands=ands, flags=1)
    ring = noisy_sum_circuit(ctx.ring_bits, 20).and_count
    assert noisy_sum_circuit(ctx.ring_bits, 20, field=True).and_count == ring + 3


def test_dng_is_exactly_16_bytes_per_coordinate(ctx) -> None:
    for n in (1, 777):
        m = bench_comm.MODES["dng"].measure(ctx, 1937.3, n)
        assert m.phases == {"opened": 16 * n}  # one 8-byte ring element each way
    assert bench_comm.dng_ring_bits(ctx, 1937.3) > ctx.ring_bits  # the noise tails live in it


def test_spgc_per_coordinate_cost_is_constant_and_tables_are_24_6_bytes_per_and(ctx) -> None:
    _, sigma = bench_comm.sigma_units_for(ctx, 8.0, 1e-3, "classic")
    assert sigma == pytest.approx(math.sqrt(2 * math.log(1.25e3)) / 8 * ctx.l2_bound_units)
    spec = bench_comm.MODES["spgc"]
    spec.prepare(ctx, sigma)
    per_coord = []
    for n in (500, 2000):
        m = spec.measure(ctx, sigma, n)
        # every garbled AND gate (rejected trials included) costs 24.625 bytes (three-halves;
        # a gate's 5-bit control fields are padded to a byte per chunk: at most 1e-3 more)
        assert 24.625 * m.and_gates * n <= m.phases["tables"] <= 24.65 * m.and_gates * n
        assert m.extra["trials_per_coordinate"] >= 1
        per_coord.append(m.total / n)
    assert per_coord[0] == pytest.approx(per_coord[1], rel=0.08)


def test_json_rows_scaling_and_paper_figures(capsys) -> None:
    rc = bench_comm.run(
        "diabetes", [0.5, 8.0], modes=["only-mpc", "dng"], coordinates=256, as_json=True
    )
    assert rc == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert "only-mpc" in out.err and "table16" not in out.out  # the table went to stderr
    assert "counted on the link" in out.err and "charged" not in out.err
    assert len(rows) == 4
    for r in rows:
        for key in ("mode", "epsilon", "sigma_units", "bytes_per_coordinate", "bytes_per_step"):
            assert key in r
        assert r["seconds_per_step"] > 0 and r["seconds_per_round"] == r["seconds_per_step"]
        assert "peak_rss_mb_per_worker" not in r  # no workers: nothing to report
        assert r["charged_phases"] == []  # gc: every byte counted on the link
        assert r["dim"] == 642 and r["scaled_to_dim"] and r["coordinates_measured"] == 256
        assert r["bytes_per_step"] == pytest.approx(r["bytes_per_coordinate"] * 642)
        for name, rate in (("1gbit", 1e9), ("10gbit", 1e10)):
            link = r[f"link_seconds_per_step_{name}"]
            assert link == pytest.approx(8 * r["bytes_per_step"] / rate)
            assert r[f"bound_at_{name}"] == ("link" if link > r["seconds_per_step"] else "compute")
        # 3 providers x 200 rows / batch 10 = 20 steps per epoch
        assert r["steps_per_training"] == 20 * bench_comm.DEFAULT_EPOCHS
        assert r["bytes_per_training"] == pytest.approx(
            r["bytes_per_step"] * r["steps_per_training"] + r["session_setup_bytes"]
        )
    om = [r for r in rows if r["mode"] == "only-mpc"]
    assert om[0]["sigma_units"] == 0 and om[0]["paper_gb_per_training"] == 4.4
    assert om[0]["paper_bytes_per_step"] == pytest.approx(4.4e9 / 400)
    assert om[0]["bytes_per_coordinate_small"] == pytest.approx(
        om[0]["bytes_per_coordinate"], rel=0.05
    )
    assert om[0]["and_gates_per_second"] > 0
    dng = [r for r in rows if r["mode"] == "dng"]
    assert [r["bytes_per_coordinate"] for r in dng] == [16.0, 16.0]
    assert [r["and_gates_per_second"] for r in dng] == [0.0, 0.0]  # no circuit
    assert dng[0]["sigma_units"] > dng[1]["sigma_units"] > 0  # eps 0.5 noisier than eps 8


def test_table_baseline_is_labelled_and_plot_is_written(tmp_path, capsys) -> None:
    png = tmp_path / "comm.png"
    rc = bench_comm.run(
        "cancer", [8.0], modes=["only-mpc", "table16"], table_coordinates=8, as_json=True,
        plot=png,
    )  # fmt: skip
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    table = next(r for r in rows if r["mode"] == "table16")
    assert "NOT differentially private" in table["label"] and not table["differentially_private"]
    assert table["coordinates_measured"] == 8 and table["ring_bits"] == 16
    # 2^16 - 16 - 1 AND gates of the lookup plus the subtract/add: 24.625 B each (8 coordinates
    # in one chunk: each gate's 40 control bits are 5 whole bytes)
    assert table["and_gates_per_coordinate"] > 2**16 - 17
    assert table["phase_bytes_per_coordinate"]["tables"] == pytest.approx(
        24.625 * table["and_gates_per_coordinate"]
    )
    assert table["paper_gb_per_training"] == 698.8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--epsilon", "0"], "epsilon must be finite and > 0"),
        (["--epsilon", "-1", "2"], "epsilon must be finite and > 0"),
        (["--modes", "spgc", "ldp"], "unknown mode 'ldp'"),
        (["--calibration", "exact"], "calibration must be classic or analytic"),
        (["--delta", "2"], "delta must be in (0, 1)"),
        (["--chunk", "-5"], "--chunk must be at least 1"),
        (["--table-coordinates", "0"], "--table-coordinates must be at least 4"),
        (["--verify-inputs", "l2", "--modes", "dng"], "measures modes spgc and only-mpc"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_code_2(capsys, argv, message) -> None:
    assert cli.main(["bench", "comm", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("spgc: error:")


def test_preprocessed_opens_one_ring_element_each_way_online(ctx) -> None:
    spec = bench_comm.MODES["preprocessed"]
    _, sigma = bench_comm.sigma_units_for(ctx, 8.0, 1e-3, "classic")
    spec.prepare(ctx, sigma)
    n = 300
    m = spec.measure(ctx, sigma, n)
    assert m.phases["opened"] == 16 * n and m.extra["online_bytes_per_coordinate"] == 16
    # offline: the sampler's garbled trials, at least 24.625 B per AND of one trial each
    trial = build_trial_circuit(derive_params(sigma))
    assert m.extra["offline_bytes_per_coordinate"] > 24.625 * trial.and_count
    assert m.extra["ring_bits"] > ctx.ring_bits  # the ring holds |S| plus the noise bound


# Ray: one local cluster at a time on this machine (tests/servers/test_ray_workers.py).
@pytest.mark.xdist_group("ray")
def test_workers_run_the_circuits_on_ray_worker_pairs(ctx, capsys) -> None:
    """--workers 2: the circuits run on two worker pairs of a local Ray cluster; bytes are
    those of both pairs (each lane its own chunks and session setup), rows say so."""
    pytest.importorskip("ray", reason="the Ray extra (pip install '.[ray]') is missing")
    rc = bench_comm.run(
        "cancer", [8.0], modes=["only-mpc", "spgc", "preprocessed"], coordinates=200,
        workers=2, as_json=True,
    )  # fmt: skip
    assert rc == 0
    out = capsys.readouterr()
    rows = {r["mode"]: r for r in json.loads(out.out)}
    assert "2 Ray worker pairs" in out.err
    assert all(r["workers"] == 2 for r in rows.values())
    # two session setups (one per worker pair), each what one link costs
    assert rows["only-mpc"]["session_setup_bytes"] == 2 * ctx.session_setup_bytes
    # only-mpc on 62 coordinates (d): two lanes of 31, each exactly the engine's closed form
    om = rows["only-mpc"]
    lane = only_mpc_closed_form(ctx.ring_bits, 31)
    per_coord = om["phase_bytes_per_coordinate"]
    measured = {k: v * om["coordinates_measured"] for k, v in per_coord.items()}
    assert om["coordinates_measured"] == 62
    assert measured == pytest.approx({k: 2 * v for k, v in lane.items()})
    assert rows["spgc"]["phase_bytes_per_coordinate"]["tables"] > 24.6 * 500
    assert rows["preprocessed"]["offline_bytes_per_coordinate"] > 24.6 * 500
    # each row: the round's time and AND/s, and each of the 4 workers' peak memory so far
    for r in rows.values():
        assert r["seconds_per_round"] > 0
        # preprocessed: the round opens precomputed shares, its circuit ran offline
        assert (r["and_gates_per_second"] > 0) == (r["mode"] != "preprocessed")
        rss = r["peak_rss_mb_per_worker"]
        assert len(rss) == 4 and all(50 < x < 4000 for x in rss)
    spgc = rows["spgc"]  # all d = 62 coordinates measured: the round's time is the measured one
    assert not spgc["scaled_to_dim"]
    assert spgc["and_gates_per_second"] == pytest.approx(
        spgc["and_gates_per_coordinate"] * 62 / spgc["seconds_per_round"]
    )
    assert "peak RSS per worker after the last row (MB): " in out.err


def test_epsilon_list_takes_either_spelling():
    """`spgc experiment` says --epsilons; `spgc bench comm` accepts that spelling too."""
    parser = bench_comm_cli.build_parser()
    assert parser.parse_args(["--epsilons", "0.5", "2"]).epsilon == [0.5, 2.0]
    assert parser.parse_args(["--epsilon", "8"]).epsilon == [8.0]


def test_a_model_with_frozen_parameters_counts_its_trained_coordinates(tmp_path) -> None:
    """`--model FILE:FACTORY`: d is the trained coordinates (what the servers sum, noise and
    release); a frozen backbone never travels, so bytes per step scale with the head alone."""
    (tmp_path / "tuned.py").write_text(
        "from torch import nn\n\n"
        "def head_only():\n"
        "    m = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))\n"
        "    m[0].requires_grad_(False)\n    return m\n"
    )
    ctx = bench_comm.make_context("cancer", model=f"{tmp_path / 'tuned.py'}:head_only")
    assert (ctx.dim, ctx.model_parameters) == (130, 30 * 64 + 64 + 130)
    assert bench_comm.make_context("cancer").dim == 62  # the dataset's own, nothing frozen
    with pytest.raises(bench_comm.BenchCommError, match=r"--model nope\.py:f: "):
        bench_comm.make_context("cancer", model="nope.py:f")


def test_gmw_backend_rows_count_round_trips_and_amortise_the_silent_ots(capsys) -> None:
    """--backend gmw: the same spgc rounds on GMW with silent-OT triples; the OT phase is charged
    at silent OT's steady state (one OT each way per AND group), the round trips are the AND
    channel's count (the AND layers plus the outputs and the opening: the reconstruction and
    the noisy sum ride in the trial run), and the implied round time adds them at each
    round-trip time."""
    rc = bench_comm.run("cancer", [8.0], modes=["spgc"], as_json=True, backend="gmw")
    assert rc == 0
    out = capsys.readouterr()
    (row,) = json.loads(out.out)
    assert row["backend"] == "gmw"
    # Said to be charged, in the JSON and under the table; the other figures are counted.
    assert row["charged_phases"] == ["ot_extension"]
    assert (
        "but gmw's OT column, and so its part of B/coord and of every total, is charged, "
        "not counted: 2 x the random OTs" in out.err
    )
    assert row["bytes_per_coordinate"] < 2000  # issue 34's target (gc: about 17,500 here)
    bits = bench_comm_charges.silent_ot_params()["bits_per_ot"]
    ot = row["phase_bytes_per_coordinate"]["ot_extension"]
    # One random OT each way per AND group (gates of a layer sharing an input), not per gate.
    ots = row["random_ots_per_coordinate"]
    assert 0.5 * row["and_gates_per_coordinate"] < ots < row["and_gates_per_coordinate"]
    assert ot == pytest.approx(2 * ots * bits / 8, rel=0.01)
    # At most MAX_TRIAL_DEPTH (28) AND layers a trial run (depth-aware arithmetic, issue 47),
    # one run a sampler stage: its layers, its outputs and the opening, the run header riding
    # with the first layer unless the silent OT starts an iteration (then one more).
    assert 20 <= row["and_layers"] <= MAX_TRIAL_DEPTH * row["rounds"]
    stages = row["rounds"]
    assert row["and_layers"] + stages + 1 <= row["round_trips"] <= row["and_layers"] + 3 * stages
    for rtt_name, rtt in bench_comm.ROUND_TRIP_TIMES.items():
        implied = row[f"round_seconds_1gbit_{rtt_name}"]
        wire = row["link_seconds_per_step_1gbit"] + row["round_trips"] * rtt
        assert implied == pytest.approx(max(wire, row["seconds_per_step"]))


def _malicious_row(capsys, backend: str) -> tuple[dict, str]:
    """One cancer spgc row at epsilon 8 under --security malicious on ``backend``, 16
    coordinates: (the JSON row, stderr)."""
    rc = bench_comm.run(
        "cancer", [8.0], modes=["spgc"], as_json=True, backend=backend, security="malicious",
        coordinates=16,
    )  # fmt: skip
    assert rc == 0
    out = capsys.readouterr()
    (row,) = json.loads(out.out)
    assert row["security"] == "malicious" and row["backend"] == backend
    return row, out.err


def test_security_malicious_rows_run_authenticated_gmw(capsys) -> None:
    """--security malicious (--backend gmw): the same spgc round on authenticated GMW, its
    triples made a batch at a time into a stock during the warm-up (bucket size 3), the run
    charged the triples it used at the stock's cost: their own messages with the openings
    ("tables"), their COTs with silent OT's charge."""
    row, err = _malicious_row(capsys, "gmw")
    assert "(security: malicious, authenticated GMW)" in err
    assert "each run is charged the triples it used" in err
    ands = row["and_gates_per_coordinate"]
    # At least the U blocks (9 bytes each way) of 3 leaky triples per AND gate, though the
    # measured run made none of its triples itself (the stock did).
    assert row["phase_bytes_per_coordinate"]["tables"] > 3 * 18 * ands
    # 3 COTs each way per leaky triple, 3 leaky triples per AND gate, one per input bit (the
    # shares and masks), and one per AND gate of the seed proofs (the trials' random bits are
    # the proved stream: a ChaCha8 block, about 4,500 AND gates, per coordinate and stage).
    proved = row["proved_and_gates_per_coordinate"]
    assert 6000 <= proved <= 3 * 6600  # a block or two a coordinate, and the commitment
    assert 9 * ands + proved <= row["random_ots_per_coordinate"] <= 11 * ands + 1.05 * proved


def test_security_malicious_rows_run_authenticated_garbling(capsys) -> None:
    """--security malicious --backend gc: the same spgc round on authenticated garbling, charged
    like authenticated GMW (the stock's triples, silent OT's COTs), its tables 81 bytes per AND
    gate on top, in a handful of round trips where authenticated GMW takes one per AND layer."""
    row, err = _malicious_row(capsys, "gc")
    assert "(security: malicious, authenticated garbling)" in err
    ands = row["and_gates_per_coordinate"]
    assert row["phase_bytes_per_coordinate"]["tables"] > (3 * 18 + AUTH_TABLE_BYTES) * ands
    proved = row["proved_and_gates_per_coordinate"]  # the seed proofs, as on gmw
    assert 9 * ands + proved <= row["random_ots_per_coordinate"] <= 12 * ands + 1.05 * proved
    # The round is fused as on gmw (one trial run with spares, then the exchange): per engine
    # run its header, the input masks (2), the gates' openings (1), the check and the outputs,
    # a run per sampler stage (almost always one), plus a silent-OT iteration's turns when one
    # starts inside the round, and the seed proofs': the commitment's 3 exchanges, and a
    # stage's blocks in a batch or two (one exchange each) and 2.
    assert row["and_layers"] == row["rounds"]
    assert row["round_trips"] <= 7 * row["rounds"] + 12 + 3 + 4 * row["rounds"]


def test_security_malicious_preprocessed_rows_prove_the_production_seeds(capsys) -> None:
    """Mode preprocessed under --security malicious: the production run proves both seeds as
    the daemons do (a pool block's commitment, then a ChaCha8 block or two a sample), and the
    online round stays one ring element each way (16 bytes a coordinate)."""
    rc = bench_comm.run(
        "cancer", [8.0], modes=["preprocessed"], as_json=True, backend="gmw",
        security="malicious", coordinates=16,
    )  # fmt: skip
    assert rc == 0
    (row,) = json.loads(capsys.readouterr().out)
    proved = row["proved_and_gates_per_coordinate"]
    assert 4448 <= proved <= 3 * 6600  # at least a block a sample, and the commitment
    assert row["online_bytes_per_coordinate"] == 16  # a uint64 each way, as semi-honest


def test_security_malicious_is_refused_where_there_is_no_variant() -> None:
    with pytest.raises(bench_comm.BenchCommError, match=r"--security malicious: .*only-mpc"):
        bench_comm.run("cancer", [8.0], modes=["only-mpc"], backend="gc", security="malicious")
    with pytest.raises(bench_comm.BenchCommError, match=r"--security malicious: .*dng"):
        bench_comm.run("cancer", [8.0], modes=["dng"], backend="gmw", security="malicious")
