"""`spgc bench gc`: runs per thread count, checked against plaintext, put against the AES rate."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from garbled_core import AUTH_TABLE_BYTES, DEFAULT_CHUNK, and_table_bytes
from spgc.app import bench_gc, cli
from spgc.common.lanes import lane_ranges


def test_one_row_per_thread_count_each_checked_and_put_against_aes() -> None:
    aes = 4e8  # AES blocks per second: a stated rate, so the ratio is checked exactly
    runs = bench_gc.bench_gc(
        instances=3000,
        modes=("plaintext",),
        threads=(1, 2),
        aes_rate=aes,
        log=lambda _: None,
        schemes=("threehalves", "halfgates"),
    )
    assert [(r.scheme, r.mode, r.threads) for r in runs] == [
        ("threehalves", "plaintext", 1),
        ("threehalves", "plaintext", 2),
        ("halfgates", "plaintext", 1),
        ("halfgates", "plaintext", 2),
    ]
    for r in runs:
        assert r.correct
        assert r.and_gates == 95 * 3000
        if r.scheme == "halfgates":
            assert r.bytes_per_and == 32.0  # two 16-byte rows per AND gate
        else:  # three 8-byte halves and 5 control bits, per engine chunk in each lane's range
            chunks = [
                min(DEFAULT_CHUNK, hi - start)
                for lo, hi in lane_ranges(3000, r.threads)
                for start in range(lo, hi, DEFAULT_CHUNK)
            ]
            per_gate = sum(and_table_bytes("threehalves", c) for c in chunks)
            assert r.bytes_per_and == per_gate / 3000
        # SoftSpoken at the default k: ceil(128 / k) bits per input bit (k = 7: 2.375 bytes)
        assert r.eval_input_bytes_per_bit == -(-128 // bench_gc.DEFAULT_OT_K) / 8
        assert r.ratio_to_aes_ceiling == pytest.approx(r.and_gates_per_second / (aes / 4))
    assert runs[0].speedup_vs_one_thread == 1.0 and runs[2].speedup_vs_one_thread == 1.0
    assert runs[1].speedup_vs_one_thread == pytest.approx(
        runs[1].and_gates_per_second / runs[0].and_gates_per_second
    )
    table = bench_gc.format_table(runs, aes)
    assert "x ceiling" in table and "100.0 M AND/s" in table
    assert "threehalves" in table and "halfgates" in table


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_aes_rate_from_openssl_speed() -> None:
    rate = bench_gc.aes_blocks_per_second()
    assert rate is not None and rate > 1e6  # any machine of this century


@pytest.mark.parametrize("bad", ["0", "1,99", "two"])
def test_cli_refuses_thread_counts_out_of_range(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse: usage and one error line
        cli.main(["bench", "gc", "--threads", bad])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--threads" in err and "Traceback" not in err


def test_cli_json_has_the_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench_gc.run_cli(
        instances=1000, insecure=True, both=False, chunk=None, as_json=True, threads=(1,)
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["threads"] == 1 and out["correct"]
    if out["aes128_blocks_per_second"] is not None:
        assert out["ceiling_and_gates_per_second"] == out["aes128_blocks_per_second"] / 4
        assert out["ratio_to_aes_ceiling"] == pytest.approx(
            out["and_gates_per_second"] / out["ceiling_and_gates_per_second"]
        )


def test_repeat_reports_each_configurations_median_run() -> None:
    """--repeat 3: every configuration runs three times, set after set; each row is the run
    with the median rate, carrying all three rates, and the table shows their range."""
    aes = 4e8
    logged: list[str] = []
    runs = bench_gc.bench_gc(
        instances=2000,
        modes=("plaintext",),
        threads=(1, 2),
        aes_rate=aes,
        log=logged.append,
        repeat=3,
    )
    assert [(r.mode, r.threads) for r in runs] == [("plaintext", 1), ("plaintext", 2)]
    assert [m for m in logged if m.startswith("set ")] == ["set 1 of 3", "set 2 of 3", "set 3 of 3"]
    for r in runs:
        assert r.correct and len(r.repeat_and_gates_per_second) == 3
        assert r.and_gates_per_second == sorted(r.repeat_and_gates_per_second)[1]
    assert runs[1].speedup_vs_one_thread == pytest.approx(
        runs[1].and_gates_per_second / runs[0].and_gates_per_second
    )
    table = bench_gc.format_table(runs, aes)
    low, high = (f(runs[0].repeat_and_gates_per_second) / 1e8 for f in (min, max))
    assert "range of 3" in table and f"{low:.3f}-{high:.3f}" in table
    assert "the median of 3 runs" in table
    with pytest.raises(ValueError, match="--repeat"):
        bench_gc.bench_gc(instances=10, repeat=0, log=lambda _: None)


def test_party_processes_do_not_rerun_the_callers_main_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `spgc bench gc` runs under the `spgc` script, whose module imports torch: spawned parties
    # re-running it cost seconds each. A stand-in main script leaves a mark if it is re-run.
    mark = tmp_path / "main-ran"
    script = tmp_path / "fake_main.py"
    script.write_text(f"open({str(mark)!r}, 'a').write('ran\\n')\n")
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    runs = bench_gc.bench_gc(instances=200, modes=("plaintext",), threads=(1,), log=lambda _: None)
    assert [r.correct for r in runs] == [True]
    assert not mark.exists()
    assert sys.modules["__main__"] is fake_main  # put back after the parties started


def test_both_backends_run_the_same_circuit_and_compare_cpu_rates(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--backend both: a gc row and a gmw row (GMW parties, silent-OT triples), each checked
    against the plaintext evaluation, with AND gates per CPU-second and their ratio."""
    rc = bench_gc.run_cli(
        instances=20_000, insecure=True, both=False, chunk=None, as_json=True, threads=(1,),
        backends=bench_gc.BACKENDS,
    )  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    rows = {r["scheme"]: r for r in out["runs"]}
    assert set(rows) == {"threehalves", "gmw"}
    assert rows["gmw"]["backend"] == "gmw" and rows["threehalves"]["backend"] == "gc"
    assert all(r["correct"] for r in rows.values())
    assert rows["gmw"]["garble_only_and_gates_per_second"] is None
    # GMW: half a byte per AND gate (openings and triples) plus the silent OT's setup, about
    # 0.8 MB, which 1.9M AND gates do not amortise; garbling 24.625 bytes
    assert rows["gmw"]["bytes_per_and"] < 2 and rows["threehalves"]["bytes_per_and"] > 24
    for r in rows.values():
        cpu = r["cpu_seconds_garbler"] + r["cpu_seconds_evaluator"]
        assert r["and_gates_per_cpu_second"] == pytest.approx(r["and_gates"] / cpu)
    assert out["gmw_vs_gc_and_gates_per_cpu_second"] == pytest.approx(
        rows["gmw"]["and_gates_per_cpu_second"] / rows["threehalves"]["and_gates_per_cpu_second"]
    )
    assert "gmw / gc AND gates per CPU-second" in captured.err


@pytest.mark.parametrize(
    ("backend", "semi_honest", "levels_key", "least_bytes"),
    [
        # authenticated GMW: MACs on every COT-made share and B leaky triples per AND gate
        ("gmw", "gmw", "malicious_vs_semi_honest", 100),
        # authenticated garbling: the same, and 81 bytes of table per AND gate
        ("gc", "threehalves", "gc_malicious_vs_semi_honest", 100 + AUTH_TABLE_BYTES),
    ],
)
def test_security_both_runs_the_authenticated_form_beside_the_backend(
    capsys: pytest.CaptureFixture[str],
    backend: str,
    semi_honest: str,
    levels_key: str,
    least_bytes: int,
) -> None:
    """--security both: the backend's semi-honest row and its malicious row (authenticated GMW,
    ``gmw-malicious``; authenticated garbling, ``gc-malicious``), each checked against the
    plaintext evaluation, with their bytes and CPU per AND gate compared in the same run."""
    rc = bench_gc.run_cli(
        instances=300, insecure=True, both=False, chunk=None, as_json=True, threads=(1,),
        backends=(backend,), security=bench_gc.SECURITY_LEVELS,
    )  # fmt: skip
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    rows = {r["scheme"]: r for r in out["runs"]}
    malicious = rows[f"{backend}-malicious"]
    assert set(rows) == {semi_honest, f"{backend}-malicious"}
    assert malicious["security"] == "malicious" and malicious["backend"] == backend
    assert rows[semi_honest]["security"] == "semi-honest"
    assert all(r["correct"] for r in rows.values())
    assert malicious["bytes_per_and"] > least_bytes
    assert out[levels_key]["bytes_per_and"] == pytest.approx(
        malicious["bytes_per_and"] / rows[semi_honest]["bytes_per_and"]
    )
    assert f"malicious / semi-honest {backend}" in captured.err


def test_the_malicious_rows_are_bounded_in_instances() -> None:
    with pytest.raises(ValueError, match="at most"):
        bench_gc.bench_gc(instances=10**6, schemes=(bench_gc.GC_MALICIOUS,), log=lambda _: None)
