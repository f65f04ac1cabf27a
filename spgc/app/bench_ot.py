"""`spgc bench ot`: correlated OT between the two servers, silent (Ferret) against SoftSpoken.

Runs both parties in two threads over loopback and prints, per OT source: bits per OT on the
wire after setup (both directions), OTs per second (wall clock, both parties on this machine),
the setup's seconds and bytes, and the parameters. Silent OT (garbled_core silent_ot.h: Ferret,
CCS 2020, LPN with regular noise over its local linear code, GGM trees, bootstrapping) sends
t (2h + 1) blocks per iteration of n - k - t h OTs after a one-time setup; SoftSpoken k = 7
(the garbled-circuit backend's OT extension) sends ceil(128 / 7) bits per OT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from garbled_core import DEFAULT_OT_K
from garbled_core.ot_measure import (
    cot_receive,
    cot_send,
    silent_cot_receive,
    silent_cot_send,
    silent_ot_params,
)
from spgc.app.bench_sampler import BackgroundParty, loopback_channels

# One main iteration of Ferret's set: about 10.2 million OTs, 163 MB of labels per party.
DEFAULT_OTS = 0  # 0: one whole iteration of the silent set (usable_per_iteration)
SOFTSPOKEN_OTS = 1 << 22


def _total_bytes(counts: dict[str, Any], stage: str) -> int:
    return int(counts[f"{stage}_sent"]) + int(counts[f"{stage}_received"])


def bench_silent(ots: int, tls_dir: Path | None) -> dict[str, Any]:
    """Ferret's parameter set: setup, then ``ots`` OTs (one iteration by default)."""
    params = silent_ot_params()
    m = ots or int(params["usable_per_iteration"])
    ch_g, ch_e = loopback_channels(tls_dir)
    try:
        start = time.perf_counter()
        sender = BackgroundParty(lambda: silent_cot_send(ch_g, m))
        _, _, receiver_counts = silent_cot_receive(ch_e, m)
        _, _, sender_counts = sender.result()
        wall = time.perf_counter() - start
    finally:
        ch_g.close()
        ch_e.close()
    # Each direction counted once: the sender's sent bytes are the receiver's received ones.
    setup_bytes = _total_bytes(sender_counts, "setup")
    extend_bytes = _total_bytes(sender_counts, "extend")
    extend_seconds = max(sender_counts["extend_seconds"], receiver_counts["extend_seconds"])
    setup_seconds = max(sender_counts["setup_seconds"], receiver_counts["setup_seconds"])
    main = params["main"]
    return {
        "source": "silent",
        "construction": "Ferret (CCS 2020), regular-noise LPN, local linear code d = 10",
        "secure": bool(params["secure"]),
        "ots": m,
        "bits_per_ot": 8.0 * extend_bytes / m,
        "bits_per_ot_formula": float(params["bits_per_ot"]),
        "ots_per_second": m / extend_seconds if extend_seconds > 0 else None,
        "setup_seconds": setup_seconds,
        "setup_bytes": setup_bytes,
        "iterations": int(sender_counts["iterations"]),
        "seconds": wall,
        "lpn": {"n": main["n"], "k": main["k"], "t": main["t"], "h": main["h"]},
    }


def bench_softspoken(ots: int, tls_dir: Path | None, ot_k: int = DEFAULT_OT_K) -> dict[str, Any]:
    """SoftSpoken k = ``ot_k`` with random choices, setup included in the bytes (it is small:
    128 base OTs)."""
    m = -(-ots // 8) * 8
    choices = np.frombuffer(os.urandom(m // 8), dtype=np.uint8).copy()
    ch_g, ch_e = loopback_channels(tls_dir)
    try:
        start = time.perf_counter()
        sender = BackgroundParty(lambda: cot_send(ch_g, m, ot_k))
        cot_receive(ch_e, choices, ot_k)
        sender.result()
        seconds = time.perf_counter() - start
        wire = sum(v["sent"] for v in ch_g.counters().values()) + sum(
            v["sent"] for v in ch_e.counters().values()
        )
    finally:
        ch_g.close()
        ch_e.close()
    return {
        "source": f"softspoken-k{ot_k}",
        "construction": f"SoftSpoken OT extension, k = {ot_k} (setup included)",
        "secure": True,
        "ots": m,
        "bits_per_ot": 8.0 * wire / m,
        "ots_per_second": m / seconds,
        "seconds": seconds,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'source':<16} {'OTs':>11} {'bits/OT':>8} {'OTs/s':>12} {'setup s':>8} {'setup B':>10}"
    ]
    for r in rows:
        setup_s = f"{r['setup_seconds']:.2f}" if "setup_seconds" in r else "-"
        setup_b = f"{r['setup_bytes']:,}" if "setup_bytes" in r else "-"
        rate = f"{r['ots_per_second']:,.0f}" if r.get("ots_per_second") else "-"
        lines.append(
            f"{r['source']:<16} {r['ots']:>11,} {r['bits_per_ot']:>8.3f} {rate:>12} "
            f"{setup_s:>8} {setup_b:>10}"
        )
    return "\n".join(lines)


def run(ots: int = DEFAULT_OTS, *, tls: bool = False, as_json: bool = False) -> int:
    """Run the benchmark; the table goes to stdout (stderr with ``as_json``, the JSON list to
    stdout). Returns the exit code."""
    if ots < 0:
        raise ValueError(f"ots must be >= 0, got {ots}")
    out = sys.stderr if as_json else sys.stdout
    with tempfile.TemporaryDirectory(prefix="spgc-bench-ot-") as tmp:
        tls_dir = Path(tmp) if tls else None
        rows = [bench_silent(ots, tls_dir), bench_softspoken(ots or SOFTSPOKEN_OTS, tls_dir)]
    link_kind = "TLS 1.3" if tls else "plaintext TCP"
    print(f"correlated OT, two parties over loopback ({link_kind}), both on this machine", file=out)
    print(format_table(rows), file=out)
    if as_json:
        print(json.dumps(rows, indent=2))
    return 0


def _ots(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: one silent iteration), got {value}")
    return value


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of `spgc bench ot` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog="spgc bench ot", description=__doc__)
    p.add_argument(
        "--ots",
        type=_ots,
        default=DEFAULT_OTS,
        metavar="M",
        help="OTs after setup (default: one iteration of the silent set, about 10.2 million; "
        f"SoftSpoken then runs {SOFTSPOKEN_OTS:,})",
    )
    p.add_argument("--tls", action="store_true", help="TLS 1.3 link with a throwaway dev PKI")
    p.add_argument(
        "--json", action="store_true", help="print a JSON list on stdout (the table goes to stderr)"
    )
    return p


def run_from_args(args: argparse.Namespace) -> int:
    """Runs with the options :func:`build_parser` parsed (`spgc bench ot` and ``main``)."""
    return run(args.ots, tls=args.tls, as_json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m spgc.app.bench_ot [options]``."""
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
