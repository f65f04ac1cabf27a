"""`spgc bench gc`: garbled-circuit engine throughput, garbler and evaluator in two processes.

The benchmark circuit is one coordinate of a typical server-side step on 32-bit words:
``D = A - B``, ``c = D < T`` (signed), ``Y = c ? D : A``, revealed to both parties; A and T are the
garbler's inputs, B the evaluator's. Every run is checked against the circuit's plaintext
evaluation.

Speeds are put against the machine's single-core AES-128 rate, measured in the same run with
``openssl speed -evp aes-128-ecb``: a half-gates garbler needs 4 AES blocks per AND gate, so
that rate / 4 is the AND gates per second one core could garble at most (``x ceiling``).
``--threads`` runs each link once per lane count T: each party opens T connections and runs T
independent engine sessions on T contiguous ranges of the instances, one thread each
(:mod:`spgc.common.lanes`); ``--scheme``
picks the garbling scheme (three-halves, the default, or half-gates; ``both`` runs each).
``--backend gmw`` runs the same circuit with GMW parties instead (XOR shares, Boolean Beaver
triples from silent OT, one message each way per AND layer; rows with scheme ``gmw``), and
``--backend both`` runs each: ``and_gates_per_cpu_second`` (AND gates over both parties' CPU
seconds) is compared between them in the same run (``gmw_vs_gc_and_gates_per_cpu_second``).
``--security malicious`` runs the authenticated form of each backend instead: authenticated
GMW (rows ``gmw-malicious``: authenticated shares, triples from the leaky AND and bucketing,
every opening MAC-checked) and authenticated garbling (rows ``gc-malicious``: the same shares
and triples under garbled tables whose rows carry MACs); ``--security both`` runs both levels
and compares bytes and CPU per AND gate in the same run (``malicious_vs_semi_honest`` for gmw,
``gc_malicious_vs_semi_honest`` for gc); its runs default to
``MALICIOUS_DEFAULT_INSTANCES`` instances.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

import garbled_core
from garbled_core.circuit import CircuitBuilder
from spgc.common.lanes import MAX_LANES, lane_ranges, run_lanes
from spgc.protocol.certs import make_dev_pki

WIDTH = 32
GARBLER_INPUTS: tuple[str, ...] = ("a", "t")
EVALUATOR_INPUTS: tuple[str, ...] = ("b",)
OWNER_GARBLER = "garbler"
OWNER_EVALUATOR = "evaluator"
HOST = "127.0.0.1"
CONNECT_TIMEOUT = 30.0

LINKS = ("plaintext", "tls")
MAX_THREADS = MAX_LANES  # lanes per party (each its own connection, session and thread)
AES_CALLS_PER_AND = 4  # half-gates garbling: 2 hashes per half gate, 2 half gates per AND
MODE_LABEL = {"plaintext": "plaintext", "tls": "TLS"}
SCHEMES: tuple[str, ...] = tuple(garbled_core.GARBLING_SCHEMES)  # the first is the default
GMW = "gmw"  # the scheme label of the GMW backend's rows (no garbling scheme: XOR shares)
# The rows of authenticated GMW (security: malicious; garbled_core.AuthGmwParty).
GMW_MALICIOUS = "gmw-malicious"
GMW_SCHEMES: tuple[str, ...] = (GMW, GMW_MALICIOUS)
# The rows of authenticated garbling (security: malicious on gc; garbled_core.AuthGarbleParty).
GC_MALICIOUS = "gc-malicious"
MALICIOUS_SCHEMES: tuple[str, ...] = (GMW_MALICIOUS, GC_MALICIOUS)
# Rows whose bytes both parties send (openings, triples, masks): counted over every phase.
BOTH_WAYS_SCHEMES: tuple[str, ...] = (*GMW_SCHEMES, GC_MALICIOUS)
BACKENDS: tuple[str, ...] = ("gc", GMW)
SECURITY_LEVELS: tuple[str, ...] = ("semi-honest", "malicious")
# Authenticated GMW holds every wire's MACs and keys (33 bytes per wire and instance) and its
# triples in memory: its runs are sized in thousands of instances, not millions.
MALICIOUS_DEFAULT_INSTANCES = 4_000
MALICIOUS_MAX_INSTANCES = 50_000
# The engine's default OT extension: SoftSpoken k = 7, ceil(128 / 7) = 19 bits (2.375 bytes) per
# evaluator input bit (0: IKNP, 16 bytes)
DEFAULT_OT_K: int = garbled_core.DEFAULT_OT_K


class BenchError(RuntimeError):
    """A benchmark could not run (engine missing, a party failed, a timeout)."""


def build_circuit() -> Any:
    """The per-coordinate benchmark circuit (about 95 AND gates per instance)."""
    b = CircuitBuilder()
    a = b.input("a", owner=OWNER_GARBLER, width=WIDTH)
    t = b.input("t", owner=OWNER_GARBLER, width=WIDTH)
    bb = b.input("b", owner=OWNER_EVALUATOR, width=WIDTH)
    d = b.sub(a, bb)
    c = b.lt_signed(d, t)
    y = b.mux(c, d, a)
    b.output("y", y, reveal="both")
    return b.build()


def random_words(n: int, bits: int = WIDTH) -> np.ndarray:
    """``n`` uniformly random ``bits``-bit words as uint64, from the OS CSPRNG."""
    raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    if bits >= 64:
        return raw.copy()
    return raw & np.uint64((1 << bits) - 1)


# ------------------------------------------------------------------------------------- parties


@dataclass
class PartyReport:
    """What one party process measured."""

    role: str
    run_seconds: float
    cpu_seconds: float
    counters: dict[str, dict[str, int]]
    outputs: dict[str, np.ndarray]


def _tls_config(gc: Any, paths: tuple[str, str, str] | None) -> Any:
    return None if paths is None else gc.TlsConfig(*paths)


def _chunk_kwargs(chunk: int | None) -> dict[str, int]:
    return {} if chunk is None else {"chunk": chunk}


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


def _run_party(
    role: str,
    channels: list[Any],
    inputs: dict[str, np.ndarray],
    chunk: int | None,
    circuit: Any,
    scheme: str = SCHEMES[0],
    ot_k: int = DEFAULT_OT_K,
) -> PartyReport:
    """This party's side over its lanes: lane i (channel i, its own session, its own thread)
    runs instances lane_ranges(n, lanes)[i]."""
    gc = garbled_core
    if scheme == GMW:  # Beaver triples from silent OT, as the gmw data link makes them
        parties = [gc.GmwParty(ch, role, ot="silent") for ch in channels]
    elif scheme == GMW_MALICIOUS:  # authenticated shares and triples (security: malicious)
        parties = [gc.AuthGmwParty(ch, role) for ch in channels]
    elif scheme == GC_MALICIOUS:  # authenticated garbling on the same shares and triples
        parties = [gc.AuthGarbleParty(ch, role) for ch in channels]
    else:
        party_cls = gc.Garbler if role == OWNER_GARBLER else gc.Evaluator
        parties = [
            party_cls(ch, scheme=scheme, ot_k=ot_k, **_chunk_kwargs(chunk)) for ch in channels
        ]
    # Arrays that crossed a process boundary carry an unpickled (equal but not identical)
    # dtype object; re-view them with numpy's canonical uint64 dtype.
    inputs = {
        k: np.ascontiguousarray(v, dtype=np.uint64).view(np.uint64) for k, v in inputs.items()
    }
    n = len(next(iter(inputs.values())))
    ranges = lane_ranges(n, len(channels))

    def lane(i: int) -> Callable[[], dict[str, Any]]:
        lo, hi = ranges[i]
        return lambda: parties[i].run(circuit, {k: v[lo:hi] for k, v in inputs.items()}, n=hi - lo)

    cpu0, t0 = time.process_time(), time.perf_counter()
    outs = run_lanes(
        [lane(i) for i in range(len(channels))], on_failure=lambda i: channels[i].interrupt()
    )
    run_seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu0
    counters: dict[str, dict[str, int]] = {}
    for ch in channels:
        for phase, values in ch.counters().items():
            mine = counters.setdefault(phase, {})
            for key, value in values.items():
                mine[key] = mine.get(key, 0) + int(value)
    outputs = {
        k: np.concatenate([np.asarray(o[k], dtype=np.uint64) for o in outs]) for k in outs[0]
    }
    return PartyReport(role, run_seconds, cpu_seconds, counters, outputs)


def _report_error(conn: Connection, role: str) -> None:
    exc_type, exc, _ = sys.exc_info()
    name = exc_type.__name__ if exc_type else "Error"
    with contextlib.suppress(OSError, ValueError):
        conn.send(("error", f"{role}: {name}: {exc}", traceback.format_exc()))


def _garbler_main(
    conn: Connection,
    tls: tuple[str, str, str] | None,
    inputs: dict[str, np.ndarray],
    chunk: int | None,
    lanes: int,
    scheme: str,
    ot_k: int,
) -> None:
    """Garbler process: listen on an ephemeral loopback port, report it, take one connection
    per lane (in the order the evaluator makes them), run, report results."""
    try:
        gc = garbled_core
        circuit = build_circuit()
        listener = gc.Listener(HOST, 0)
        conn.send(("port", int(listener.port)))
        channels = []
        try:
            for _ in range(lanes):
                channels.append(
                    listener.accept(
                        tls=_tls_config(gc, tls), insecure=tls is None, timeout=CONNECT_TIMEOUT
                    )
                )
            report = _run_party(OWNER_GARBLER, channels, inputs, chunk, circuit, scheme, ot_k)
        finally:
            for channel in channels:
                _close(channel)
            _close(listener)
        conn.send(("ok", report))
    except BaseException:
        _report_error(conn, OWNER_GARBLER)
    finally:
        conn.close()


def _evaluator_main(
    conn: Connection,
    port: int,
    tls: tuple[str, str, str] | None,
    inputs: dict[str, np.ndarray],
    chunk: int | None,
    lanes: int,
    scheme: str,
    ot_k: int,
) -> None:
    """Evaluator process: one connection to the garbler per lane, run, report results."""
    try:
        gc = garbled_core
        circuit = build_circuit()
        channels = []
        try:
            for _ in range(lanes):
                channels.append(
                    gc.Channel.connect(
                        HOST,
                        port,
                        tls=_tls_config(gc, tls),
                        insecure=tls is None,
                        timeout=CONNECT_TIMEOUT,
                    )
                )
            report = _run_party(OWNER_EVALUATOR, channels, inputs, chunk, circuit, scheme, ot_k)
        finally:
            for channel in channels:
                _close(channel)
        conn.send(("ok", report))
    except BaseException:
        _report_error(conn, OWNER_EVALUATOR)
    finally:
        conn.close()


def _exit_status(proc: Any) -> str:
    proc.join(timeout=2.0)
    code = proc.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _receive(conn: Connection, proc: Any, what: str, deadline: float) -> Any:
    """Next message from a child, or BenchError if it died, failed or ran out of time."""
    while not conn.poll(0.2):
        if not proc.is_alive() and not conn.poll(0):
            raise BenchError(f"{what} process ended without a result ({_exit_status(proc)})")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for the {what}")
    try:
        msg = conn.recv()
    except EOFError as exc:
        raise BenchError(f"{what} process ended without a result ({_exit_status(proc)})") from exc
    if msg[0] == "error":
        if os.environ.get("SPGC_DEBUG"):
            raise BenchError(f"{msg[1]}\n{msg[2]}")
        raise BenchError(f"{msg[1]} (SPGC_DEBUG=1 shows the traceback)")
    return msg[1]


# ------------------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    """One end-to-end run (garbler and evaluator over loopback)."""

    mode: str
    threads: int
    instances: int
    scheme: str
    ot_k: int
    and_per_instance: int
    and_gates: int
    wall_seconds: float
    and_gates_per_second: float
    garble_only_and_gates_per_second: float | None  # None for gmw (nothing to garble)
    bytes_per_and: float
    eval_input_bytes_per_bit: float
    cpu_seconds_garbler: float
    cpu_seconds_evaluator: float
    correct: bool
    counters: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    backend: str = "gc"
    security: str = "semi-honest"
    and_gates_per_cpu_second: float = 0.0  # AND gates / (garbler + evaluator CPU seconds)
    speedup_vs_one_thread: float | None = None  # against the T = 1 run of the same link
    ratio_to_aes_ceiling: float | None = None  # end-to-end rate / (AES blocks per s / 4)
    # With --repeat N: this is the median run of N; the end-to-end rates of all N, in run order.
    repeat_and_gates_per_second: list[float] = field(default_factory=list)


def _sum_sent(counters: dict[str, dict[str, int]], phases: Iterable[str]) -> int:
    return sum(int(counters.get(p, {}).get("sent", 0)) for p in phases)


@contextlib.contextmanager
def _spawn_without_main_module() -> Iterator[None]:
    """Start spawned processes that do not re-run the parent's main module.

    A spawned child first re-imports the parent's ``__main__``: here the ``spgc`` command line,
    which imports torch, several seconds per party on a cold disk. The parties need only this
    module, which unpickling their target imports. ``Process.start()`` reads ``__main__`` once,
    synchronously, so a bare stand-in for that call is enough.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def run_two_party(
    circuit: Any,
    instances: int,
    mode: str,
    chunk: int | None,
    garble_only_rate: float | None,
    log: Callable[[str], None],
    threads: int = 1,
    scheme: str = SCHEMES[0],
    ot_k: int = DEFAULT_OT_K,
) -> RunResult:
    """Run the circuit on ``instances`` random inputs in two processes (each party on
    ``threads`` lanes, AND gates garbled by ``scheme``); check the result."""
    import multiprocessing as mp

    if mode not in LINKS:
        raise ValueError(f"unknown mode {mode!r}")
    ctx = mp.get_context("spawn")
    inputs_g = {name: random_words(instances) for name in GARBLER_INPUTS}
    inputs_e = {name: random_words(instances) for name in EVALUATOR_INPUTS}
    deadline = time.monotonic() + 600.0 + 1e-3 * instances

    with tempfile.TemporaryDirectory(prefix="spgc-bench-") as tmp:
        tls_g = tls_e = None
        if mode == "tls":
            pki = make_dev_pki(Path(tmp), [OWNER_GARBLER, OWNER_EVALUATOR])
            tls_g = tuple(
                str(p)
                for p in (pki[OWNER_GARBLER].cert, pki[OWNER_GARBLER].key, pki[OWNER_GARBLER].ca)
            )
            tls_e = tuple(
                str(p)
                for p in (
                    pki[OWNER_EVALUATOR].cert,
                    pki[OWNER_EVALUATOR].key,
                    pki[OWNER_EVALUATOR].ca,
                )
            )

        g_parent, g_child = ctx.Pipe()
        e_parent, e_child = ctx.Pipe()
        garbler = ctx.Process(
            target=_garbler_main,
            args=(g_child, tls_g, inputs_g, chunk, threads, scheme, ot_k),
            name="spgc-garbler",
        )
        evaluator = None
        log(
            f"{'evaluating' if scheme in GMW_SCHEMES else 'garbling'} {instances:,} instances "
            f"({scheme}) over {MODE_LABEL[mode]} (loopback, "
            f"2 processes, {threads} lane(s) each) ..."
        )
        try:
            with _spawn_without_main_module():
                garbler.start()
            g_child.close()
            port = _receive(g_parent, garbler, "garbler", deadline)
            evaluator = ctx.Process(
                target=_evaluator_main,
                args=(e_child, port, tls_e, inputs_e, chunk, threads, scheme, ot_k),
                name="spgc-evaluator",
            )
            with _spawn_without_main_module():
                evaluator.start()
            e_child.close()
            rep_e: PartyReport = _receive(e_parent, evaluator, "evaluator", deadline)
            rep_g: PartyReport = _receive(g_parent, garbler, "garbler", deadline)
        finally:
            for proc in (garbler, evaluator):
                if proc is None or proc.pid is None:
                    continue
                proc.join(timeout=5.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            g_parent.close()
            e_parent.close()

    expected = circuit.evaluate({**inputs_g, **inputs_e})
    correct = bool(expected) and all(
        name in rep.outputs and np.array_equal(rep.outputs[name], np.asarray(want, np.uint64))
        for rep in (rep_g, rep_e)
        for name, want in expected.items()
    )

    and_per_instance = int(circuit.and_count)
    and_gates = and_per_instance * instances
    wall = max(rep_g.run_seconds, rep_e.run_seconds)
    cpu = rep_g.cpu_seconds + rep_e.cpu_seconds
    if scheme in BOTH_WAYS_SCHEMES:  # both parties' openings, triples, masks (tables), each way
        phases = ["tables", "ot_extension", "inputs", "outputs"]
        table_bytes = _sum_sent(rep_g.counters, phases) + _sum_sent(rep_e.counters, phases)
    else:
        table_bytes = _sum_sent(rep_g.counters, ["tables"])
    eval_input_bits = instances * WIDTH * len(EVALUATOR_INPUTS)
    eval_sent = _sum_sent(rep_e.counters, ["ot_extension", "inputs"])
    log(f"  done in {wall:.2f} s; output {'matches' if correct else 'DIFFERS FROM'} plaintext")
    return RunResult(
        mode=mode,
        threads=threads,
        instances=instances,
        scheme=scheme,
        ot_k=ot_k,
        and_per_instance=and_per_instance,
        and_gates=and_gates,
        wall_seconds=wall,
        and_gates_per_second=and_gates / wall if wall > 0 else float("inf"),
        garble_only_and_gates_per_second=garble_only_rate,
        bytes_per_and=table_bytes / and_gates if and_gates else float("nan"),
        eval_input_bytes_per_bit=eval_sent / eval_input_bits,
        cpu_seconds_garbler=rep_g.cpu_seconds,
        cpu_seconds_evaluator=rep_e.cpu_seconds,
        correct=correct,
        counters={"garbler": rep_g.counters, "evaluator": rep_e.counters},
        backend=GMW if scheme in GMW_SCHEMES else "gc",
        security="malicious" if scheme in MALICIOUS_SCHEMES else "semi-honest",
        and_gates_per_cpu_second=and_gates / cpu if cpu > 0 else float("inf"),
    )


def garble_only_rate(
    circuit: Any,
    instances: int,
    chunk: int | None,
    log: Callable[[str], None],
    scheme: str = SCHEMES[0],
) -> float:
    """AND gates per second of garbling alone (one process, tables discarded)."""
    gc = garbled_core
    log(f"garbling {instances:,} instances ({scheme}) without a peer (garble-only) ...")
    seconds = float(gc.garble_only(circuit, instances, scheme=scheme, **_chunk_kwargs(chunk)))
    and_gates = int(circuit.and_count) * instances
    log(f"  done in {seconds:.2f} s")
    return and_gates / seconds if seconds > 0 else float("inf")


def aes_blocks_per_second(seconds: int = 1) -> float | None:
    """Single-core AES-128 blocks per second, as ``openssl speed -evp aes-128-ecb`` measures
    on 16 KiB buffers; None when openssl is not installed or prints no figure."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cmd = [openssl, "speed", "-evp", "aes-128-ecb", "-seconds", str(seconds), "-bytes", "16384"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    # The last line: "AES-128-ECB  11213553.66k" (thousands of bytes per second).
    found = re.search(r"^aes-128-ecb\s+([0-9.]+)k\s*$", out, re.IGNORECASE | re.MULTILINE)
    return None if found is None else float(found.group(1)) * 1000 / 16


# ------------------------------------------------------------------------------------- output

_COLUMNS = (
    ("scheme", "{:<13}"),
    ("mode", "{:<9}"),
    ("T", "{:>2}"),
    ("AND gates", "{:>13,}"),
    ("e2e M AND/s", "{:>11.2f}"),
    ("x T=1", "{:>5}"),
    ("x ceiling", "{:>9}"),
    ("garble-only M AND/s", "{:>19}"),
    ("M AND/CPU-s", "{:>11.2f}"),
    ("bytes/AND", "{:>9.2f}"),
    ("eval B/input bit", "{:>16.2f}"),
    ("wall s", "{:>8.2f}"),
    ("CPU s garbler", "{:>13.2f}"),
    ("CPU s evaluator", "{:>15.2f}"),
    ("correct", "{:>7}"),
)


def _ratio(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _millions(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def _ceiling_range(r: RunResult, aes_rate: float | None) -> str:
    """'lowest-highest' x ceiling over a repeated configuration's runs."""
    if not aes_rate or not r.repeat_and_gates_per_second:
        return "-"
    ceiling = aes_rate / AES_CALLS_PER_AND
    return f"{min(r.repeat_and_gates_per_second) / ceiling:.3f}-" + (
        f"{max(r.repeat_and_gates_per_second) / ceiling:.3f}"
    )


def format_table(runs: list[RunResult], aes_rate: float | None = None) -> str:
    """The human-readable result table, one row per configuration (its median run when
    repeated, with the range of x ceiling over the repeats) and the AES ceiling it is put
    against."""
    repeats = max((len(r.repeat_and_gates_per_second) for r in runs), default=0)
    columns = list(_COLUMNS)
    if repeats > 1:
        columns.insert(7, (f"range of {repeats}", "{:>11}"))
    widths = [len(fmt.format(*([0] if "," in fmt or "f" in fmt else [""]))) for _, fmt in columns]
    widths = [max(w, len(name)) for w, (name, _) in zip(widths, columns, strict=True)]
    header = "  ".join(
        name.rjust(w) if i else name.ljust(w)
        for i, ((name, _), w) in enumerate(zip(columns, widths, strict=True))
    )
    lines = [header, "-" * len(header)]
    for r in runs:
        values = [
            r.scheme,
            MODE_LABEL[r.mode],
            r.threads,
            r.and_gates,
            r.and_gates_per_second / 1e6,
            _ratio(r.speedup_vs_one_thread, 2),
            _ratio(r.ratio_to_aes_ceiling, 3),
            _ratio(_millions(r.garble_only_and_gates_per_second), 2),
            r.and_gates_per_cpu_second / 1e6,
            r.bytes_per_and,
            r.eval_input_bytes_per_bit,
            r.wall_seconds,
            r.cpu_seconds_garbler,
            r.cpu_seconds_evaluator,
            "yes" if r.correct else "NO",
        ]
        if repeats > 1:
            values.insert(7, _ceiling_range(r, aes_rate))
        cells = [fmt.format(v) for (_, fmt), v in zip(columns, values, strict=True)]
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
    if repeats > 1:
        lines.append(
            f"each row: the median of {repeats} runs (sets of every configuration, one set after "
            "the other); range: the lowest and highest x ceiling of those runs"
        )
    if aes_rate is None:
        lines.append("x ceiling: - (openssl speed did not run)")
    else:
        lines.append(
            f"x ceiling: end-to-end AND/s over the single-core half-gates ceiling, "
            f"{aes_rate / AES_CALLS_PER_AND / 1e6:.1f} M AND/s ({aes_rate / 1e6:.1f} M AES-128 "
            f"blocks/s by openssl speed -evp aes-128-ecb, / {AES_CALLS_PER_AND} per AND gate)"
        )
    return "\n".join(lines)


def to_json(
    runs: list[RunResult], chunk: int | None, aes_rate: float | None = None
) -> dict[str, Any]:
    """One JSON object: the primary run's keys at top level (the first scheme's TLS run if it
    ran, its first thread count), all runs in `runs`."""
    primary = next((r for r in runs if r.mode == "tls" and r.scheme == runs[0].scheme), runs[0])
    obj: dict[str, Any] = asdict(primary)
    obj["chunk"] = chunk
    obj["aes128_blocks_per_second"] = aes_rate
    obj["ceiling_and_gates_per_second"] = None if aes_rate is None else aes_rate / AES_CALLS_PER_AND
    obj["circuit"] = "y = (a - b <s t) ? a - b : a, 32-bit"
    ratio = gmw_vs_gc(runs)
    if ratio is not None:
        obj["gmw_vs_gc_and_gates_per_cpu_second"] = ratio
    levels = malicious_vs_semi_honest(runs)
    if levels is not None:
        obj["malicious_vs_semi_honest"] = levels
    garbled_levels = malicious_vs_semi_honest(runs, GC_MALICIOUS)
    if garbled_levels is not None:
        obj["gc_malicious_vs_semi_honest"] = garbled_levels
    if len(runs) > 1:
        obj["runs"] = [asdict(r) for r in runs]
    return obj


def gmw_vs_gc(runs: list[RunResult]) -> float | None:
    """GMW's AND gates per CPU-second over the garbled backend's (its first scheme), both on
    the same link with one lane, measured in the same run; None unless both ran."""
    one = {(r.scheme, r.mode): r for r in runs if r.threads == 1}
    for (scheme, mode), r in one.items():
        if scheme in SCHEMES and (GMW, mode) in one and r.and_gates_per_cpu_second > 0:
            return one[GMW, mode].and_gates_per_cpu_second / r.and_gates_per_cpu_second
    return None


def malicious_vs_semi_honest(
    runs: list[RunResult], malicious: str = GMW_MALICIOUS
) -> dict[str, float] | None:
    """A malicious row against the semi-honest row of its backend (authenticated GMW against
    GMW; authenticated garbling, ``GC_MALICIOUS``, against the first garbling scheme that ran),
    one lane on the same link in the same run: bytes per AND gate and AND gates per
    CPU-second, as ratios; None unless both ran."""
    one = {(r.scheme, r.mode): r for r in runs if r.threads == 1}
    for (scheme, mode), r in one.items():
        m = one.get((malicious, mode))
        usable = m is not None and r.bytes_per_and > 0 and m.and_gates_per_cpu_second > 0
        semi_honest = scheme == GMW if malicious == GMW_MALICIOUS else scheme in SCHEMES
        if semi_honest and usable:
            return {
                "bytes_per_and": m.bytes_per_and / r.bytes_per_and,
                "cpu_per_and": r.and_gates_per_cpu_second / m.and_gates_per_cpu_second,
            }
    return None


def _median_run(runs: list[RunResult]) -> RunResult:
    """The run with the median end-to-end rate (the lower middle one of an even count), with
    every run's rate attached; a run that was incorrect is reported whatever its rate."""
    wrong = [r for r in runs if not r.correct]
    ranked = sorted(runs, key=lambda r: r.and_gates_per_second)
    chosen = wrong[0] if wrong else ranked[(len(runs) - 1) // 2]
    if len(runs) > 1:
        chosen.repeat_and_gates_per_second = [r.and_gates_per_second for r in runs]
    return chosen


def bench_gc(
    instances: int = 1_000_000,
    modes: tuple[str, ...] = ("tls",),
    chunk: int | None = None,
    log: Callable[[str], None] | None = None,
    threads: tuple[int, ...] = (1,),
    aes_rate: float | None = None,
    schemes: tuple[str, ...] = SCHEMES[:1],
    ot_k: int = DEFAULT_OT_K,
    repeat: int = 1,
) -> list[RunResult]:
    """Per scheme: the garble-only rate, then a two-process run per mode and thread count;
    returns the results (``aes_rate``: AES-128 blocks per second, for
    ``ratio_to_aes_ceiling``). ``repeat`` > 1 runs the whole set of configurations that many
    times, one set after the other (so a noisy minute touches every configuration alike), and
    reports each configuration's median run."""
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    if instances < 1:
        raise ValueError("--instances must be at least 1")
    if chunk is not None and chunk < 1:
        raise ValueError("--chunk must be at least 1")
    if not threads or any(not 1 <= t <= MAX_THREADS for t in threads):
        raise ValueError(f"--threads: each thread count must be in 1..{MAX_THREADS}")
    if not schemes or any(s not in (*SCHEMES, *BOTH_WAYS_SCHEMES) for s in schemes):
        raise ValueError(f"--scheme: each scheme must be one of {', '.join(SCHEMES)}")
    if not 0 <= ot_k <= 8:
        raise ValueError("--ot-k must be in 0..8 (0: IKNP)")
    if set(MALICIOUS_SCHEMES) & set(schemes) and instances > MALICIOUS_MAX_INSTANCES:
        raise ValueError(
            f"--security malicious: at most {MALICIOUS_MAX_INSTANCES:,} instances (the "
            "authenticated parties keep every wire's MAC and key in memory); pass --instances"
        )

    def _stderr(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log = log or _stderr
    circuit = build_circuit()
    log(f"circuit: {int(circuit.and_count)} AND gates per instance")
    schemes = tuple(dict.fromkeys(schemes))
    rates = {
        scheme: None
        if scheme in BOTH_WAYS_SCHEMES
        else garble_only_rate(circuit, instances, chunk, log, scheme)
        for scheme in schemes
    }
    configs = [(s, m, t) for s in schemes for m in modes for t in dict.fromkeys(threads)]
    done: dict[tuple[str, str, int], list[RunResult]] = {c: [] for c in configs}
    for i in range(repeat):
        if repeat > 1:
            log(f"set {i + 1} of {repeat}")
        for scheme, mode, t in configs:
            done[scheme, mode, t].append(
                run_two_party(
                    circuit,
                    instances,
                    mode,
                    chunk,
                    rates[scheme],
                    log,
                    threads=t,
                    scheme=scheme,
                    ot_k=ot_k,
                )
            )
    runs = []
    base: RunResult | None = None
    for scheme, mode, t in configs:
        run = _median_run(done[scheme, mode, t])
        if not runs or (runs[-1].scheme, runs[-1].mode) != (scheme, mode):
            base = None  # speed-ups are against the T = 1 run of the same scheme and link
        if t == 1:
            base = run
        if base is not None and base.and_gates_per_second > 0:
            run.speedup_vs_one_thread = run.and_gates_per_second / base.and_gates_per_second
        if aes_rate:
            run.ratio_to_aes_ceiling = run.and_gates_per_second / (aes_rate / AES_CALLS_PER_AND)
        runs.append(run)
    return runs


def run_cli(
    instances: int,
    insecure: bool,
    both: bool,
    chunk: int | None,
    as_json: bool,
    threads: tuple[int, ...] = (1,),
    schemes: tuple[str, ...] = SCHEMES[:1],
    ot_k: int = DEFAULT_OT_K,
    repeat: int = 1,
    backends: tuple[str, ...] = ("gc",),
    security: tuple[str, ...] = ("semi-honest",),
) -> int:
    """Entry point for `spgc bench gc`; returns the exit code (1 if any run was incorrect).
    ``backends``: gc runs ``schemes``, gmw one GMW run per link and thread count at each level
    of ``security`` (malicious: authenticated GMW, and for gc authenticated garbling, row
    ``gc-malicious``)."""
    modes: tuple[str, ...] = LINKS if both else (("plaintext",) if insecure else ("tls",))
    gmw_rows = ((GMW,) if "semi-honest" in security else ()) + (
        (GMW_MALICIOUS,) if "malicious" in security else ()
    )
    gc_rows = (schemes if "semi-honest" in security else ()) + (
        (GC_MALICIOUS,) if "malicious" in security else ()
    )
    gc_rows = gc_rows if "gc" in backends else ()
    schemes = gc_rows + (gmw_rows if GMW in backends else ())
    aes_rate = aes_blocks_per_second()  # first, while nothing else of ours runs
    runs = bench_gc(
        instances=instances,
        modes=modes,
        chunk=chunk,
        threads=threads,
        aes_rate=aes_rate,
        schemes=schemes,
        ot_k=ot_k,
        repeat=repeat,
    )
    table = format_table(runs, aes_rate)
    ratio = gmw_vs_gc(runs)
    if ratio is not None:
        table += f"\ngmw / gc AND gates per CPU-second (one lane, same link, this run): {ratio:.2f}"
    levels = malicious_vs_semi_honest(runs)
    if levels is not None:
        table += (
            f"\nmalicious / semi-honest gmw (one lane, same link, this run): "
            f"{levels['bytes_per_and']:.1f}x the bytes per AND gate, "
            f"{levels['cpu_per_and']:.1f}x the CPU per AND gate"
        )
    garbled_levels = malicious_vs_semi_honest(runs, GC_MALICIOUS)
    if garbled_levels is not None:
        table += (
            f"\nmalicious / semi-honest gc (one lane, same link, this run): "
            f"{garbled_levels['bytes_per_and']:.1f}x the bytes per AND gate, "
            f"{garbled_levels['cpu_per_and']:.1f}x the CPU per AND gate"
        )
    if as_json:
        print(table, file=sys.stderr)
        print(json.dumps(to_json(runs, chunk, aes_rate), indent=2, sort_keys=True))
    else:
        print(table)
    if not all(r.correct for r in runs):
        print("spgc: error: garbled output differs from the plaintext evaluation", file=sys.stderr)
        return 1
    return 0
