"""`spgc bench load`: N providers against two real server daemons, over real gRPC with TLS.

Both servers run as separate processes (`python -m spgc.servers`, configured by
:func:`spgc.app.demo.write_configs`: a development CA, one certificate per provider). The N
providers run as threads in a few worker processes (`python -m spgc.app.bench_load --worker
SPEC`). Each is the real provider library (:class:`spgc.providers.client.ProviderClient`: Hello
to both servers and the plan checks, the RoundStatus long poll, FetchModel checked against
both servers' hashes, the one sharing routine, SubmitShare to both, retries) with one method
replaced: ``encode`` returns a random clipped fixed-point total of the model's size (the
announced encoding of random examples clipped to C) instead of computing gradients, so a
provider costs little CPU.

Rounds. The servers run ``1 + R`` rounds (``2 + 2R`` with ``--hostile``). Round 0 is a warm-up,
not counted: it opens as soon as the servers are paired and closes once every provider has
connected and sent its share, so it measures start-up. A round's time is its period at H1: from
H1's log line of round t-1 (written when t-1 is published) to that of round t, i.e. round t from
open to publish plus the checkpoint of round t-1. Rounds close as soon as every listed
provider's share is in (min_providers is 90% of N; round_deadline is long, 30 s + 0.06 s per
provider). ``missed_providers`` counts provider-rounds whose share is not in the sum (from H1's
round records, which name every provider left out and why).

Hostile actors (``--hostile K``): after the R quiet rounds, one round (not counted) holds the
providers until every actor has begun its first call, so that the next R rounds, however short,
all run while K actors of each of three kinds repeat their action every ``--hostile-interval``
seconds (default 0.5 s) from a separate process: a silent or slow SubmitShare stream from a
certificate of the CA that is not a provider ("intruder"); a TCP connection to H1's
garbled-circuit port sending junk (the port is closed once the servers are linked: a refused
connection is counted as such); a malformed request (bytes that do not parse) to an Aggregator
method, alternately as a provider (its own certificate) and as the intruder. The result counts
every hostile call by how it was answered (gRPC status names, or what the TCP connection did);
calls started after the last round's line (the servers were stopping) are counted apart, under
``after_last_round``.

Poisoning providers (``--poison K``, verified inputs): the last K providers are
:class:`~spgc.app.bench_load_actors.PoisonProvider`s, registered, with their real keys, who
cheat the norm proof in every round, the cheating provers of spgc.app.cheating_provers in turn
(the adaptive forger that solves for the appended values, non-bits, a grinder, a wrapping
vector re-shared until it fits, disagreeing parts, a replay); the servers run with
``verify_inputs: l2``. From H1's round records, over every round of the run:
``poison_attempts`` (their shares that reached H1), ``poison_accepted`` (those in a round's
sum), ``poison_refused`` (left out for the proof), ``poison_kinds`` (the same per kind, with
the servers' reasons) and ``missed_providers`` (honest provider-rounds not in the sum). The
same command first runs the same N providers, all honest, without verification
(``--no-baseline`` skips it) and reports both median rounds and their ratio.

Resources: the servers' peak resident set (VmHWM from /proc/PID/status, sampled while they run,
and the figure each server writes in its summary as it stops; never the kernel's ru_maxrss,
which counts the memory of the process the server was forked from) and CPU seconds (user +
system, from the kernel's rusage of the reaped process); per round, the median CPU seconds of
each server, of all provider workers, of the hostile process, of the whole machine (/proc/stat)
and of everything else that ran meanwhile ("others"). Providers, hostile actors and both servers
share the machine's cores: its CPU count and load are reported next to the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from spgc.app.bench_load_actors import INTRUDER, BenchProvider, hostile_main, worker_main
from spgc.app.bench_load_poison import audited_refusals, honest_missed, poison_figures
from spgc.app.demo import (
    DATASET_DEFAULTS,
    DemoError,
    DemoOptions,
    _child_env,
    _start,
    _stop,
    _tail,
    write_configs,
)
from spgc.common.memory import peak_rss_kb
from spgc.common.progress import Progress
from spgc.learning.data import DATA_ERRORS, load_dataset
from spgc.protocol.modes import TWO_SERVER_MODES, default_verify_inputs
from spgc.settings.config import ConfigError

__all__ = [
    "BenchLoadError",
    "BenchProvider",
    "LoadOptions",
    "build_parser",
    "main",
    "run_bench",
    "run_from_args",
    "run_with_baseline",
]

PROG = "spgc bench load"
MAX_PROVIDERS = 100_000
DEFAULT_HOSTILE_INTERVAL = 0.5
# The servers' round line, written when a round is published (or skipped), with its time.
_ROUND_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO spgc\.servers\.coordinator: "
    r"h1 round (\d+) (->|skipped)"
)
_PARAMETERS = re.compile(r"h1 serving on port \d+ \(mode [\w-]+, d=(\d+),")


class BenchLoadError(RuntimeError):
    """The benchmark could not run, or a server failed; the message says which and why."""


@dataclass
class LoadOptions:
    """What `spgc bench load` runs (see the module docstring)."""

    providers: int = 100
    rounds: int = 5
    hostile: int = 0
    dataset: str = "cancer"
    mode: str = "spgc"
    processes: int = 0  # 0: one per 25 providers, 1..8 (see worker_count)
    round_deadline: float = 0.0  # 0: 30 s + 0.06 s per provider
    hostile_interval: float = DEFAULT_HOSTILE_INTERVAL
    timeout: float = 3600.0
    keep: bool = False
    # The last ``poison`` providers send vectors over the bound (verified inputs only).
    poison: int = 0
    # none or l2; None: the servers' default (l2 in mode spgc: default_verify_inputs).
    verify_inputs: str | None = None

    @property
    def honest(self) -> int:
        return self.providers - self.poison

    @property
    def worker_count(self) -> int:
        # Many provider threads in one process spend their CPU queueing for its GIL: at 1,000
        # providers 8 processes cost 6.4 CPU s per round against 11 with 2 (measured).
        default = min(8, max(1, -(-self.providers // 25)))
        return max(1, min(self.processes or default, self.providers))

    @property
    def deadline(self) -> float:
        return self.round_deadline or 30.0 + 0.06 * self.providers

    @property
    def total_rounds(self) -> int:
        return 2 + 2 * self.rounds if self.hostile else 1 + self.rounds

    @property
    def hostile_rounds(self) -> range:
        """The rounds measured under the hostile actors (after the one that waits for them)."""
        return range(2 + self.rounds, self.total_rounds)


# ----------------------------------------------------------------------------- the bench


@dataclass
class _Tally:
    """What the workers reported (updated by their reader threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    connected: int = 0
    accepted: dict[int, int] = field(default_factory=dict)
    failed: int = 0
    finished: int = 0
    errors: list[str] = field(default_factory=list)
    first_connected: float | None = None
    all_connected: float | None = None
    # provider -> the reasons the servers gave it for leaving its shares out
    told: dict[str, list[str]] = field(default_factory=dict)

    def read(self, stream: TextIO, total: int) -> None:
        for line in stream:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                kind = ev.get("event")
                if kind == "connected":
                    self.connected += 1
                    now = time.monotonic()
                    self.first_connected = self.first_connected or now
                    if self.connected == total:
                        self.all_connected = now
                elif kind == "round" and ev.get("ok"):
                    t = int(ev["round"])
                    self.accepted[t] = self.accepted.get(t, 0) + 1
                elif kind == "failed":
                    self.failed += 1
                    if len(self.errors) < 20:
                        self.errors.append(f"{ev['name']} round {ev.get('round')}: {ev['error']}")
                elif kind in ("refused", "error"):
                    if len(self.errors) < 20:
                        self.errors.append(f"{ev['name']}: {ev['error']}")
                elif kind == "finished":
                    self.told[str(ev.get("name"))] = list(ev.get("told", []))
                    self.finished += 1


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, every process), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    except (OSError, ValueError):
        return 0.0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class _H1Log:
    """Follows H1's log file: the time of each round line, the model's size."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.times: dict[int, float] = {}
        self.parameters: int | None = None

    def read(self) -> dict[int, float]:
        """Round -> the time of H1's line for it (published or skipped), so far."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.times
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            m = _ROUND_LINE.match(line)
            if m:
                stamp = _dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                self.times[int(m.group(2))] = stamp
            elif self.parameters is None:
                found = _PARAMETERS.search(line)
                if found:
                    self.parameters = int(found.group(1))
        return self.times


@dataclass
class _ServerWatch:
    """One server process: peak RSS and CPU while it runs, its rusage once reaped."""

    name: str
    proc: subprocess.Popen
    hwm_kb: int = 0
    cpu_seconds: float = 0.0
    rusage: Any = None

    def sample(self) -> None:
        if self.proc.returncode is not None:
            return
        self.hwm_kb = max(self.hwm_kb, peak_rss_kb(self.proc.pid) or 0)
        self.cpu_seconds = max(self.cpu_seconds, _cpu_seconds(self.proc.pid))

    def reap(self) -> bool:
        """True once the process has ended (its rusage is then kept)."""
        if self.proc.returncode is not None:
            return True
        try:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        except ChildProcessError:
            self.proc.poll()
            return self.proc.returncode is not None
        if pid == 0:
            return False
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.rusage = usage
        return True

    def figures(self, summary: dict[str, Any]) -> dict[str, float]:
        """Peak RSS (the most sampled or written in the server's ``summary`` as it stopped)
        and CPU seconds."""
        rss_mb = max(self.hwm_kb / 1024, float(summary.get("peak_rss_mb") or 0.0))
        cpu = self.cpu_seconds
        if self.rusage is not None:
            cpu = self.rusage.ru_utime + self.rusage.ru_stime
        return {"rss_mb": round(rss_mb, 1), "cpu_seconds": round(cpu, 2)}


def _percentile(values: Sequence[float], q: float) -> float | None:
    return None if not values else round(float(np.percentile(values, q)), 3)


def _validate(opts: LoadOptions) -> None:
    if opts.dataset not in DATASET_DEFAULTS:
        raise ValueError(
            f"unknown dataset {opts.dataset!r}; choose from {sorted(DATASET_DEFAULTS)}"
        )
    if opts.mode not in TWO_SERVER_MODES:
        raise ValueError(f"mode {opts.mode!r}: choose a two-server mode, {TWO_SERVER_MODES}")
    if not 1 <= opts.providers <= MAX_PROVIDERS:
        raise ValueError(f"--providers must be in 1..{MAX_PROVIDERS}")
    if opts.rounds < 1 or opts.hostile < 0 or opts.processes < 0:
        raise ValueError("--rounds must be >= 1, --hostile and --processes >= 0")
    if not opts.hostile_interval > 0 or not opts.timeout > 0 or opts.round_deadline < 0:
        raise ValueError("--hostile-interval and --timeout must be > 0, --round-deadline >= 0")
    if not 0 <= opts.poison < opts.providers:
        raise ValueError("--poison must be in 0..N-1 (at least one honest provider)")
    if opts.poison and verified(opts) != "l2":
        raise ValueError("--poison needs verified inputs (the servers' norm-proof checks)")


def verified(opts: LoadOptions) -> str:
    """The servers' verify_inputs: as given, or their default for the mode."""
    return opts.verify_inputs or default_verify_inputs(opts.mode)


def _write_workers(opts: LoadOptions, work: Path, provider_cfgs: list[Path]) -> list[Path]:
    specs = []
    count = opts.worker_count
    for w in range(count):
        indices = list(range(w, len(provider_cfgs), count))
        spec = {
            "dataset": opts.dataset,
            "providers": opts.providers,
            "configs": [str(provider_cfgs[i]) for i in indices],
            "indices": indices,
            # the round that waits for the hostile actors
            "gate_round": 1 + opts.rounds if opts.hostile else None,
            "poison": [i for i in indices if i >= opts.honest],
        }
        path = work / f"worker-{w + 1}.json"
        path.write_text(json.dumps(spec))
        specs.append(path)
    return specs


def _server_address(cfg: Path) -> tuple[str, str]:
    text = cfg.read_text()
    listen = re.search(r"^listen: (\S+)$", text, re.M)
    gc = re.search(r"^gc_address: (\S+)$", text, re.M)
    assert listen and gc  # written by write_configs
    return listen.group(1), gc.group(1)


def _spawn(args: list[str], work: Path, log_name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "spgc.app.bench_load", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(work / log_name).open("w"),
        env=_child_env(),
        cwd=work,
        text=True,
        start_new_session=True,
    )


def _tell(proc: subprocess.Popen, word: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # it has ended already
        proc.stdin.write(word + "\n")
        proc.stdin.flush()


def _await_event(
    proc: subprocess.Popen, lines: queue.Queue[str], work: Path, name: str, limit: float
) -> dict[str, Any]:
    """The hostile process's next ``{"event": name, ...}`` line, within ``limit`` seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if ev.get("event") == name:
                return ev
    raise BenchLoadError(
        f"the hostile actors' process said no {name!r} within {limit:g} s; last log lines:\n"
        + _tail(work / "hostile.log")
    )


def _how(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"died (exit status {code})"


def _failure(watches: list[_ServerWatch], work: Path, why: str) -> BenchLoadError:
    logs = "\n".join(f"--- {w.name}.log\n{_tail(work / f'{w.name}.log')}" for w in watches)
    return BenchLoadError(f"{why}; last log lines:\n{logs}")


def run_bench(opts: LoadOptions, progress: TextIO | None = sys.stderr) -> dict[str, Any]:
    """Runs the benchmark; returns its figures. Raises BenchLoadError when a server fails or
    the run times out, ValueError for bad options."""
    _validate(opts)
    load_dataset(opts.dataset)  # a missing data set: one message before anything starts
    started, start_wall = time.monotonic(), time.time()
    clock: dict[str, Any] = {
        "start_wall": start_wall,
        "load": [round(x, 2) for x in os.getloadavg()],
    }
    work = Path(tempfile.mkdtemp(prefix="spgc-bench-load-"))
    # A line per round published (on a terminal, one line rewritten in place).
    show = (
        None
        if progress is None
        else Progress(
            opts.total_rounds, "rounds published", desc=PROG, stream=progress, interval=0.0
        )
    )
    procs: list[subprocess.Popen] = []
    workers: list[subprocess.Popen] = []
    hostile: subprocess.Popen | None = None
    hostile_result: dict[str, Any] | None = None
    watches: list[_ServerWatch] = []
    tally = _Tally()
    n, deadline = opts.providers, opts.deadline
    try:
        demo = DemoOptions(
            dataset=opts.dataset,
            providers=n,
            rounds=opts.total_rounds,
            mode=opts.mode,
            max_providers=MAX_PROVIDERS,
            extra_certs=(INTRUDER,) if opts.hostile else (),
            verify_inputs=opts.verify_inputs,
            server_overrides={
                "evaluate": False,
                "round_deadline": deadline,
                "peer_timeout": deadline + 300.0,
                # the poisoners are left out of every round: the honest ones must suffice
                "min_providers": max(1, opts.honest - opts.honest // 10),
            },
        )
        try:
            server_cfgs, provider_cfgs = write_configs(demo, work)
        except DemoError as exc:
            raise ValueError(str(exc)) from None
        for i, cfg in enumerate(server_cfgs):
            proc = _start("spgc.servers", cfg, work, echo=False, out=sys.stderr)
            procs.append(proc)
            watches.append(_ServerWatch(f"h{i + 1}", proc))
        if opts.hostile:
            listen1, gc = _server_address(server_cfgs[0])
            listen2, _ = _server_address(server_cfgs[1])
            spec_path = work / "hostile.json"
            spec_path.write_text(
                json.dumps(
                    {
                        "h1": listen1,
                        "h2": listen2,
                        "gc": gc,
                        "pki": str(work / "pki"),
                        "actors": opts.hostile,
                        "interval": opts.hostile_interval,
                        "provider_names": [f"p{i + 1}" for i in range(n)],
                    }
                )
            )
            hostile = _spawn(["--hostile-actors", str(spec_path)], work, "hostile.log")
            procs.append(hostile)
        hostile_out: queue.Queue[str] = queue.Queue()
        if hostile is not None:
            threading.Thread(
                target=lambda: [hostile_out.put(x) for x in hostile.stdout], daemon=True
            ).start()
            # Its imports (seconds of CPU) done before the providers start, not during the
            # quiet rounds they would slow down.
            _await_event(hostile, hostile_out, work, "ready", min(120.0, opts.timeout))
        clock["workers"] = time.monotonic()
        for i, spec in enumerate(_write_workers(opts, work, provider_cfgs)):
            proc = _spawn(["--worker", str(spec)], work, f"worker-{i + 1}.log")
            workers.append(proc)
            procs.append(proc)
            threading.Thread(target=tally.read, args=(proc.stdout, n), daemon=True).start()
        hostile_started_round: int | None = None
        hostile_stopped = False
        total = opts.total_rounds
        h1_log = _H1Log(work / "h1.log")
        end = started + opts.timeout
        cpu: dict[int, dict[str, float]] = {}  # rounds published -> CPU seconds so far
        while True:
            for w in watches:
                w.sample()
            ended = [w.reap() for w in watches]
            times = h1_log.read()
            published = max(times) + 1 if times else 0
            if published not in cpu:
                cpu[published] = {
                    **{w.name: w.cpu_seconds for w in watches},
                    "providers": sum(_cpu_seconds(p.pid) for p in workers),
                    "hostile": 0.0 if hostile is None else _cpu_seconds(hostile.pid),
                    "bench": _cpu_seconds(os.getpid()),
                    "machine": _machine_busy_seconds(),
                }
            if hostile is not None and hostile_started_round is None and published > opts.rounds:
                # The providers hold in this round until every actor has begun (it says so
                # within 60 s, or that it could not).
                _tell(hostile, "go")
                if not _await_event(hostile, hostile_out, work, "acting", 90.0).get("ok"):
                    raise BenchLoadError(
                        "the hostile actors did not all begin within 60 s; last log lines:\n"
                        + _tail(work / "hostile.log")
                    )
                for proc in workers:
                    _tell(proc, "go")
                hostile_started_round = published
            if hostile is not None and not hostile_stopped and published >= total:
                # Calls started after the last round line met servers on their way out.
                _tell(hostile, f"stop {times.get(total - 1, max(times.values()))}")
                hostile_stopped = True
            with tally.lock:
                connected = tally.connected
            hot = hostile_started_round is not None and published < total
            if show is not None:
                show.update(
                    published,
                    providers_connected=f"{connected}/{n}",
                    hostile_actors="on" if hot else "off",
                    seconds=f"{time.monotonic() - started:.0f}",
                )
            died = [w for w, e in zip(watches, ended, strict=True) if e and w.proc.returncode != 0]
            if died:
                names = ", ".join(f"{w.name} {_how(w.proc.returncode)}" for w in died)
                raise _failure(watches, work, f"server {names} during the run")
            if all(ended):
                break
            if time.monotonic() > end:
                raise _failure(watches, work, f"the run did not finish within {opts.timeout:g} s")
            time.sleep(0.1)
        if show is not None:
            show.close(seconds=f"{time.monotonic() - started:.0f}")
            show = None
        if hostile is not None:
            _tell(hostile, "stop")
            try:
                hostile.wait(30)
            except subprocess.TimeoutExpired:
                hostile.kill()
            while not hostile_out.empty() or hostile_result is None:
                try:
                    line = hostile_out.get(timeout=5)
                except queue.Empty:
                    break
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if ev.get("event") == "result":
                        hostile_result = ev
        for proc in workers:  # the providers have seen training finish (or are told now)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.terminate()
        clock["wall"] = time.monotonic() - started
        summaries = {}
        for w in watches:
            path = work / f"{w.name}-summary.json"
            if not path.exists():
                raise _failure(watches, work, f"{w.name} wrote no summary")
            summaries[w.name] = json.loads(path.read_text())
        clock["parameters"] = h1_log.parameters
        out = _figures(
            opts, summaries, h1_log.read(), watches, tally, hostile_result, cpu, clock=clock
        )
        if verified(opts) != "none":
            out["poison_audited"] = {
                w.name: audited_refusals(work / f"{w.name}-state" / "audit.jsonl") for w in watches
            }
        return out
    finally:
        if show is not None:
            show.close()
        _stop(procs)
        if opts.keep:
            print(f"{PROG}: files kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def _figures(
    opts: LoadOptions,
    summaries: dict[str, dict[str, Any]],
    times: dict[int, float],
    watches: list[_ServerWatch],
    tally: _Tally,
    hostile: dict[str, Any] | None,
    cpu: dict[int, dict[str, float]],
    *,
    clock: dict[str, Any],
) -> dict[str, Any]:
    n, r = opts.providers, opts.rounds
    history = {int(h["round"]): h for h in summaries["h1"].get("history", [])}

    def phase(rounds: range) -> dict[str, Any]:
        periods, others = [], []
        parts: dict[str, list[float]] = {}
        for t in rounds:
            if t not in times or t - 1 not in times:
                continue
            period = times[t] - times[t - 1]
            periods.append(period)
            spent = history.get(t, {}).get("seconds", {})
            for key, value in spent.items():
                parts.setdefault(key, []).append(value)
            others.append(period - sum(spent.values()))

        breakdown = {k: _percentile(v, 50) for k, v in sorted(parts.items())}
        breakdown["rest"] = _percentile(others, 50)
        # CPU seconds per round (sampled when H1's round line appears: +- 0.1 s; when no round
        # has samples at both ends, the mean over the sampled span)
        # (machine: every process on every core; others: the machine less this benchmark's
        # processes, i.e. whatever else ran meanwhile)
        spent: dict[str, list[float]] = {}

        def add(a: int, b: int) -> None:  # rounds a..b-1, per round
            delta = {who: (cpu[b][who] - cpu[a][who]) / (b - a) for who in cpu[a]}
            ours = sum(v for who, v in delta.items() if who != "machine")
            delta["others"] = max(0.0, delta["machine"] - ours)
            for who, value in delta.items():
                spent.setdefault(who, []).append(value)

        for t in rounds:
            if t in cpu and t + 1 in cpu:
                add(t, t + 1)
        sampled = sorted(k for k in cpu if rounds.start <= k <= rounds.stop)
        if not spent and len(sampled) > 1:  # rounds shorter than the sampling: their mean
            add(sampled[0], sampled[-1])
        cpu_round = {k: _percentile(v, 50) for k, v in spent.items() if any(v)}
        return {
            "seconds": [round(s, 3) for s in periods],
            "median": _percentile(periods, 50),
            "p95": _percentile(periods, 95),
            "missed": honest_missed(opts.honest, history, rounds),
            "measured": len(periods),
            "breakdown": breakdown,
            "cpu": cpu_round,
        }

    quiet = phase(range(1, 1 + r))
    servers = {
        w.name: {**w.figures(summaries[w.name]), "exit_code": w.proc.returncode} for w in watches
    }
    alive = all(s["exit_code"] == 0 for s in servers.values()) and all(
        s.get("finished") and not s.get("failure") for s in summaries.values()
    )
    first = times.get(0)
    out: dict[str, Any] = {
        "providers": n,
        "rounds": quiet["measured"],
        "mode": opts.mode,
        "dataset": opts.dataset,
        "parameters": clock.get("parameters"),
        "processes": opts.worker_count,
        "median_round_seconds": quiet["median"],
        "p95_round_seconds": quiet["p95"],
        "round_seconds": quiet["seconds"],
        "round_breakdown_median_seconds": quiet["breakdown"],
        "missed_providers": quiet["missed"],
        "cpu_seconds_per_round_median": quiet["cpu"],
        "rss_mb_max": max(s["rss_mb"] for s in servers.values()),
        "rss_mb": {k: s["rss_mb"] for k, s in servers.items()},
        "cpu_seconds": {k: s["cpu_seconds"] for k, s in servers.items()},
        "servers_exit_codes": {k: s["exit_code"] for k, s in servers.items()},
        "servers_alive": alive,
        "providers_connected": tally.connected,
        "connect_seconds": None
        if tally.all_connected is None
        else round(tally.all_connected - clock["workers"], 2),
        "first_round_published_after_seconds": None
        if first is None
        else round(first - clock["start_wall"], 2),
        "provider_round_failures": tally.failed,
        "provider_errors": tally.errors[:5],
        "wall_seconds": round(clock["wall"], 2),
        "round_deadline_seconds": opts.deadline,
        "cpus": os.cpu_count(),
        "load_average_before": clock["load"],
    }
    out["verify_inputs"] = verified(opts)
    if out["verify_inputs"] != "none":
        out.update(poison_figures(opts.honest, opts.providers, history, range(opts.total_rounds)))
        poisoners = {f"p{i + 1}" for i in range(opts.honest, opts.providers)}
        with tally.lock:
            reasons = [r for name, rs in tally.told.items() if name in poisoners for r in rs]
        # the rounds a poisoner was told its proof was refused (RoundInfo.caller_left_out)
        out["poison_told_refused"] = sum(
            r.startswith("its norm proof was refused") for r in reasons
        )
    if opts.hostile:
        hot = phase(opts.hostile_rounds)
        counts = (hostile or {}).get("counts", {})
        out.update(
            {
                "hostile": opts.hostile,
                "hostile_interval_seconds": opts.hostile_interval,
                "hostile_rounds": hot["measured"],
                "hostile_median_round_seconds": hot["median"],
                "hostile_p95_round_seconds": hot["p95"],
                "hostile_round_seconds": hot["seconds"],
                "hostile_round_breakdown_median_seconds": hot["breakdown"],
                "hostile_missed_providers": hot["missed"],
                "hostile_cpu_seconds_per_round_median": hot["cpu"],
                "hostile_calls": counts,
                "hostile_calls_total": sum(
                    sum(v.values()) for k, v in counts.items() if k != "after_last_round"
                ),
                "hostile_calls_answered_ok": sum(v.get("OK", 0) for v in counts.values()),
            }
        )
    return out


def run_with_baseline(
    opts: LoadOptions, baseline: bool = True, progress: TextIO | None = sys.stderr
) -> dict[str, Any]:
    """:func:`run_bench` with verified inputs (and ``opts.poison`` poisoners), after the same
    providers, all honest, without verification (``baseline``): both median rounds and their
    ratio. Without ``baseline``, or without verified inputs, :func:`run_bench` alone."""
    _validate(opts)  # before the baseline runs: bad options cost nothing
    if not baseline or opts.verify_inputs != "l2":
        return run_bench(opts, progress)
    plain = run_bench(
        LoadOptions(**{**opts.__dict__, "poison": 0, "verify_inputs": "none"}), progress
    )
    result = run_bench(opts, progress)
    verified, unverified = result["median_round_seconds"], plain["median_round_seconds"]
    result.update(
        {
            "honest_median_round_seconds_verified": verified,
            "honest_median_round_seconds_unverified": unverified,
            "verification_round_ratio": (
                None if not verified or not unverified else verified / unverified
            ),
            "unverified": {k: plain[k] for k in _BASELINE_KEYS if k in plain},
        }
    )
    return result


_BASELINE_KEYS = (
    "median_round_seconds",
    "p95_round_seconds",
    "round_seconds",
    "missed_providers",
    "cpu_seconds_per_round_median",
    "servers_alive",
)


def _table(result: dict[str, Any]) -> str:
    rows = [
        ("providers", result["providers"]),
        ("worker processes", result["processes"]),
        ("mode / data set / d", f"{result['mode']} / {result['dataset']} / {result['parameters']}"),
        ("quiet rounds measured", result["rounds"]),
        ("median round (s)", result["median_round_seconds"]),
        ("p95 round (s)", result["p95_round_seconds"]),
        ("round breakdown, median (s)", result["round_breakdown_median_seconds"]),
        ("missed provider-rounds", result["missed_providers"]),
        ("CPU s per round, median", result["cpu_seconds_per_round_median"]),
    ]
    rows.append(("verified inputs", result["verify_inputs"]))
    if result["verify_inputs"] != "none":
        rows += [
            ("poisoning providers", result["poison"]),
            ("poison attempts / accepted / refused", "{} / {} / {}".format(
                result["poison_attempts"], result["poison_accepted"], result["poison_refused"]
            )),
        ]  # fmt: skip
        rows += [
            (f"  {kind}: attempts / accepted", f"{k['attempts']} / {k['accepted']}")
            for kind, k in result["poison_kinds"].items()
        ]
    if "verification_round_ratio" in result:
        rows += [
            ("median round without verification (s)",
             result["honest_median_round_seconds_unverified"]),
            ("verified / unverified median round", result["verification_round_ratio"]),
        ]  # fmt: skip
    if "hostile" in result:
        rows += [
            ("hostile actors per kind", result["hostile"]),
            ("hostile rounds measured", result["hostile_rounds"]),
            ("median hostile round (s)", result["hostile_median_round_seconds"]),
            ("p95 hostile round (s)", result["hostile_p95_round_seconds"]),
            ("missed (hostile rounds)", result["hostile_missed_providers"]),
            ("hostile calls", result["hostile_calls_total"]),
        ]
        rows += [(f"  {k}", v) for k, v in result["hostile_calls"].items()]
    rows += [
        ("servers' peak RSS (MB)", result["rss_mb"]),
        ("servers' CPU (s)", result["cpu_seconds"]),
        ("servers alive to the end", result["servers_alive"]),
        ("all providers connected in (s)", result["connect_seconds"]),
        ("wall time (s)", result["wall_seconds"]),
        ("CPUs / load before", f"{result['cpus']} / {result['load_average_before']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# ----------------------------------------------------------------------------- command line


def _count(text: str) -> int:
    try:
        return int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of `spgc bench load` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--providers", type=_count, default=100, metavar="N", help="default: 100")
    p.add_argument(
        "--rounds", type=_count, default=5, metavar="R", help="measured rounds (default: 5)"
    )
    p.add_argument(
        "--hostile",
        type=_count,
        default=0,
        metavar="K",
        help="then R more rounds while K hostile actors of each kind hit the servers",
    )
    p.add_argument("--dataset", default="cancer", choices=sorted(DATASET_DEFAULTS))
    p.add_argument("--mode", default="spgc", choices=list(TWO_SERVER_MODES))
    p.add_argument(
        "--processes",
        type=_count,
        default=0,
        metavar="P",
        help="worker processes running the providers as threads (default: one per 25 "
        "providers, 1 to 8)",
    )
    p.add_argument(
        "--round-deadline",
        type=float,
        default=0.0,
        metavar="S",
        help="the servers' round_deadline (default: 30 s + 0.06 s per provider)",
    )
    p.add_argument(
        "--hostile-interval",
        type=float,
        default=DEFAULT_HOSTILE_INTERVAL,
        metavar="S",
        help=f"seconds between one hostile actor's attempts (default: {DEFAULT_HOSTILE_INTERVAL})",
    )
    p.add_argument(
        "--verify-inputs",
        choices=("none", "l2"),
        default=None,
        help="the servers' verify_inputs (default: l2 with --poison, else the servers' default: "
        "l2 in modes spgc, dng and preprocessed); l2 given here first "
        "runs the same providers without verification as a baseline",
    )
    p.add_argument(
        "--poison",
        type=_count,
        default=0,
        metavar="K",
        help="the last K providers send vectors over the norm bound every round (scaled, "
        "one huge coordinate, wrapping the field, a proof for another vector)",
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="with verified inputs, skip the run without verification",
    )
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="default: 3600")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return p


def options_from_args(args: argparse.Namespace) -> LoadOptions:
    """The :class:`LoadOptions` of parsed arguments."""
    return LoadOptions(
        providers=args.providers,
        rounds=args.rounds,
        hostile=args.hostile,
        dataset=args.dataset,
        mode=args.mode,
        processes=args.processes,
        round_deadline=args.round_deadline,
        hostile_interval=args.hostile_interval,
        timeout=args.timeout,
        keep=args.keep,
        poison=args.poison,
        verify_inputs=args.verify_inputs or ("l2" if args.poison else None),
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Runs with the options :func:`build_parser` parsed; 0 on success, 1 when a server failed
    or the run timed out, 2 for bad options."""
    try:
        opts = options_from_args(args)
        result = run_with_baseline(
            opts, not args.no_baseline, progress=None if args.json else sys.stderr
        )
    except (ValueError, ConfigError, *DATA_ERRORS) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BenchLoadError as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(result))
    return 0 if result["servers_alive"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spgc.app.bench_load [options]``; ``--worker SPEC`` and ``--hostile-actors
    SPEC`` are the benchmark's own child processes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--worker":
        return worker_main(Path(argv[1]))
    if len(argv) == 2 and argv[0] == "--hostile-actors":
        return hostile_main(Path(argv[1]))
    try:
        return run_from_args(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
