"""`spgc bench comm`'s output: the terminal table, its notes and the PNG plot.

Rows are the plain dicts :func:`spgc.app.bench_comm.measure_rows` makes (also the ``--json``
output); nothing here measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from garbled_core.ot_measure import silent_ot_params
from spgc.app.paper_workloads import DATASETS, EPOCHS_NOTE, PAPER_PROVIDERS

__all__ = ["format_table", "notes", "write_plot"]


def _fmt_bytes(b: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _link(row: dict[str, Any], name: str) -> str:
    """Seconds the step's bytes take on the link, starred when the link bounds the step."""
    seconds = row[f"link_seconds_per_step_{name}"]
    return f"{seconds:.3g}" + ("*" if row[f"bound_at_{name}"] == "link" else "")


def format_table(rows: list[dict[str, Any]], header: str = "") -> str:
    """The terminal table: per mode and epsilon, per-coordinate bytes (both sample sizes and
    by phase), per step, per training, and the paper's Table 1 figure."""
    head = (
        f"{'mode':<12} {'eps':>5} {'sigma_u':>9} {'L':>3} {'B/coord':>9} {'(n/4)':>9} "
        f"{'OT':>7} {'tables':>9} {'outputs':>7} {'other':>6} {'per step':>9} {'s/step':>8} "
        f"{'M AND/s':>8} "
        f"{'1G s':>8} {'10G s':>8} "
        f"{'training':>9} {'paper':>9} {'x only-mpc':>10} {'paper x':>8}"
    )
    lines = [header] if header else []
    lines += [head, "-" * len(head)]
    for r in rows:
        ph = r["phase_bytes_per_coordinate"]
        other = sum(v for k, v in ph.items() if k not in ("ot_extension", "tables", "outputs"))
        paper = r["paper_gb_per_training"]
        lines.append(
            f"{r['mode']:<12} {r['epsilon']:>5g} {r['sigma_units']:>9.4g} {r['ring_bits']:>3} "
            f"{r['bytes_per_coordinate']:>9,.0f} {r['bytes_per_coordinate_small']:>9,.0f} "
            f"{ph.get('ot_extension', 0):>7,.0f} {ph.get('tables', 0):>9,.0f} "
            f"{ph.get('outputs', 0):>7,.0f} {other:>6,.0f} "
            f"{_fmt_bytes(r['bytes_per_step']):>9} {r['seconds_per_step']:>8.3g} "
            f"{r['and_gates_per_second'] / 1e6:>8.3g} "
            f"{_link(r, '1gbit'):>8} {_link(r, '10gbit'):>8} "
            f"{_fmt_bytes(r['bytes_per_training']):>9} "
            f"{'-' if paper is None else format(paper, ',.1f') + ' GB':>9} "
            f"{_ratio(r['ratio_to_only_mpc']):>10} {_ratio(r['paper_ratio_to_only_mpc']):>8}"
        )
    return "\n".join(lines)


def notes(ctx: Any, rows: list[dict[str, Any]], epochs: int) -> str:
    """The lines under the table: what each column is and where its figures come from
    (``ctx``: the run's CommContext)."""
    work = DATASETS[ctx.dataset]
    steps = epochs * work.steps_per_epoch
    n = {r["mode"]: (r["coordinates_measured"], r["coordinates_small"]) for r in rows}
    sample = ", ".join(f"{m} {a} and {b}" for m, (a, b) in n.items())
    lines = [
        f"B/coord: bytes sent by both servers per coordinate, counted on the link on {sample} "
        "coordinates (the '(n/4)' column: the smaller sample, same per-coordinate cost up to "
        "per-run overhead)"
        + (
            "; but gmw's OT column, and so its part of B/coord and of every total, is charged, "
            "not counted: 2 x the random OTs the run used x "
            f"{silent_ot_params()['bits_per_ot']:.3f} bits, silent OT's steady state after setup "
            "(spgc bench ot measures it), since silent OT sends its OTs a whole LPN iteration "
            f"of {silent_ot_params()['usable_per_iteration']:,} at a time (JSON: charged_phases)"
            if any(r["charged_phases"] for r in rows)
            else ""
        ),
        f"per step = B/coord x d (d = {ctx.dim:,})"
        + (" (scaled linearly from the sample)" if any(r["scaled_to_dim"] for r in rows) else "")
        + "; s/step: straight line through the two measured sizes (per-run overhead + per "
        "coordinate), both parties sharing this machine over loopback; one-time circuit "
        "preparation not included",
        "M AND/s: the round's AND gates per second in the larger measured run (0 for dng, and "
        "for preprocessed, whose circuit runs offline; JSON: and_gates_per_second, and "
        "seconds_per_round = seconds_per_step, and with --workers peak_rss_mb_per_worker)",
        "1G s / 10G s: seconds the step's bytes take on a 1 / 10 Gbit/s link between the "
        "servers (8 x bytes / bit rate), starred (*) where that exceeds s/step: there the link, "
        "not the computation, bounds the step (JSON: link_seconds_per_step_1gbit, "
        "bound_at_1gbit, ...)",
        "OT / tables / outputs: the engine's phases ot_extension, tables, outputs; other: per-run "
        "headers, and the opened shares of dng and preprocessed (8 B each way); preprocessed: "
        "offline (the circuit making the noise shares: OT/tables/outputs) + online (opened), "
        "s/step both together",
        f"training = per step x {steps} steps ({work.steps_per_epoch} steps/epoch: "
        f"{work.rows_per_provider} rows / batch {work.batch_per_provider} per provider, "
        f"{PAPER_PROVIDERS} providers) + the session setup ({ctx.session_setup_bytes:,} B: "
        "hello, base OTs and OT-extension setup, once per engine session, one per worker "
        "pair with --workers); "
        + EPOCHS_NOTE.format(epochs=epochs),
        f"paper: Table 1 whole-training GB between the servers (its SPGC used the table sampler; "
        f"its model has d = {work.paper_dim:,}"
        + (f", ours {ctx.dim:,}" if work.paper_dim != ctx.dim else "")
        + "); GB read as 10^9 bytes; 'x only-mpc': traffic relative to only-mpc (ours, "
        "and 'paper x' the paper's SPGC/Only-MPC), independent of the step count and of d",
        f"L: ring bits (daemon's defaults: scale {ctx.scale:g}, clip {ctx.clip_norm:g}, "
        f"sensitivity {ctx.l2_bound_units} units, batch cap = the paper's per-provider "
        "batch); table16 runs the paper's ring N = 16",
        "table16: the paper's table sampler, NOT differentially private at these noise scales "
        "(SPEC.md section 4)",
    ]
    if any(not r["calibration_valid"] for r in rows):
        lines.append(
            "classic calibration at eps >= 1 is outside its proof (Dwork-Roth A.1), kept to match "
            "the paper"
        )
    return "\n".join(lines)


def write_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Bytes per step against epsilon (log axes), one line per mode, the paper's figures as
    points (its whole-training GB divided by the same number of steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["epsilon"])
        ax.plot(
            [r["epsilon"] for r in rs],
            [r["bytes_per_step"] for r in rs],
            marker="o",
            label=mode
            + {"table16": " (NOT DP)", "preprocessed": " (offline + online)"}.get(mode, ""),
        )
    for which, marker in (("spgc", "s"), ("only-mpc", "^")):
        pts = {
            r["epsilon"]: r["paper_bytes_per_step"]
            for r in rows
            if r["paper_column"] == which and r["paper_bytes_per_step"] is not None
        }
        if pts:
            xs = sorted(pts)
            name = "SPGC (table sampler)" if which == "spgc" else "Only-MPC"
            ax.scatter(xs, [pts[x] for x in xs], marker=marker, s=60, facecolors="none",
                       edgecolors="black", label=f"paper {name}", zorder=3)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-step epsilon")
    ax.set_ylabel("bytes between the servers per step")
    r0 = rows[0]
    ax.set_title(
        f"{r0['dataset']} (d = {r0['dim']:,}), delta = {r0['delta']:g}, {r0['calibration']} "
        f"calibration; paper per step = its total / {r0['steps_per_training']} steps",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
