"""The processes `spgc bench load` starts besides the servers (spgc.app.bench_load drives them).

- Provider workers (``python -m spgc.app.bench_load --worker SPEC``): a share of the
  providers, one thread each, every one a real :class:`ProviderClient` training on its slice of
  the data set (or, with ``--poison``, a :class:`PoisonProvider` cheating the norm proof);
  events (round results, refusals, exit) go to stdout as JSON lines.
- The hostile process (``--hostile-actors SPEC``): silent, junk and malformed clients, some
  holding a registered provider's certificate, some the intruder's; it prints its counts as
  JSON when told to stop.
"""

from __future__ import annotations

import gc
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import grpc
import numpy as np

from spgc.app.cheating_provers import cheat, cheat_kind
from spgc.common.logs import setup_logging
from spgc.learning.data import load_dataset, split_among_providers
from spgc.learning.gradients import clip_per_example
from spgc.protocol.norm_proof import proof_context
from spgc.providers.client import ProviderClient, ProviderRefusal, RoundFailed
from spgc.providers.training import OutgoingShare
from spgc.settings.config_files import load_provider_config
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import make_channel, split_host_port

INTRUDER = "intruder"
_AGGREGATOR = "/spgc.v1.Aggregator/"
# Requests that never parse: field number 0 (wire type 7), a length-delimited field longer
# than the bytes that follow, a varint of more than 10 bytes.
_MALFORMED_HEADS = (b"\x07", b"\x0a\x7f", b"\x08" + b"\xff" * 11)
_MALFORMED_METHODS = (
    ("Hello", "unary"),
    ("RoundStatus", "unary"),
    ("FetchModel", "stream_out"),
    ("FetchLedger", "unary"),
    ("DeclinePlan", "unary"),
    ("SubmitShare", "stream_in"),
)


# ----------------------------------------------------------------------------- providers


class BenchProvider(ProviderClient):
    """A provider that does not train: its per-example gradients are random vectors clipped
    to C (:meth:`clipped_gradients`); the real :meth:`encode` encodes them.

    Everything else is the real provider: the plan checks, the long poll, the model download
    checked against both servers' hashes, the batch draw, the encoding, the sharing
    (``make_vectors``), the streamed submissions with their retries.
    """

    #: (round, event): from that round on, take part only once the event is set
    gate: tuple[int, threading.Event] | None = None

    def load_params(self, params: np.ndarray) -> None:
        """No local model: the gradients are random."""

    def wait_for_round(self) -> Any | None:
        """The real long poll; a round at or past the gate's waits for the gate to open."""
        info = super().wait_for_round()
        if info is not None and self.gate is not None and info.round >= self.gate[0]:
            self.gate[1].wait()
        return info

    def clipped_gradients(self, idx: np.ndarray) -> np.ndarray:
        """Random examples' "gradients" (standard normal), each clipped to C."""
        rows = self.rounding_rng.standard_normal((len(idx), self.training.num_parameters))
        return clip_per_example(rows, self.training.clip_norm)


class PoisonProvider(BenchProvider):
    """A registered provider with its real keys that cheats the norm proof in every round, each
    round the kind ``cheat_kind(position, t, poisoners)`` names (spgc.app.cheating_provers: the
    adaptive forger, non-bits, grinding, a wrapping vector, disagreeing parts, a replay of a
    proof made for the previous round, or the next one in round 0)."""

    position: int = 0  # among the poisoners
    poisoners: int = 1

    def make_vectors(self, total: np.ndarray) -> list[OutgoingShare]:
        params = self.norm_proof
        if params is None:  # no verification to cheat: its vector enters the sum as it is
            return super().make_vectors(total)
        t = int(self.last_round or 0)
        kind = cheat_kind(self.position, t, self.poisoners)
        run_id, name = self.training.run_id, self.cfg.name
        other = proof_context(run_id, t - 1 if t > 0 else t + 1, name)
        leader, helper = cheat(
            kind, total, params, proof_context(run_id, t, name), other_context=other
        )
        empty = np.zeros(0, dtype=np.uint64)
        return [
            OutgoingShare(
                np.concatenate([leader.inputs, leader.proof]),
                params.p,
                leader.blind,
                leader.helper_part,
            ),
            OutgoingShare(empty, params.p, b"", helper.leader_parts, helper.seed),
        ]


class _Emitter:
    """One JSON object per line on stdout, from many threads."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lock = threading.Lock()

    def __call__(self, **event: Any) -> None:
        line = json.dumps(event)
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()


def _run_provider(client: BenchProvider, emit: _Emitter) -> None:
    name = client.cfg.name
    try:
        client.connect()
    except ProviderRefusal as exc:
        emit(event="refused", name=name, error=str(exc))
        return
    except Exception as exc:  # reported to the bench, which counts and shows it
        emit(event="error", name=name, error=f"connect: {type(exc).__name__}: {exc}")
        return
    emit(event="connected", name=name)
    try:
        while True:
            try:
                report = client.run_round()
            except RoundFailed as exc:
                emit(event="failed", name=name, round=client.last_round, error=str(exc))
                continue
            if report is None:
                # What the servers told this provider of the rounds that left its share out
                # (RoundInfo.caller_left_out), learnt by the end of training.
                told = [r.left_out for r in client.reports if r.left_out]
                emit(event="finished", name=name, told=told)
                return
            emit(event="round", name=name, round=report.round, ok=report.accepted)
    except ProviderRefusal as exc:
        emit(event="refused", name=name, error=str(exc))
    except Exception as exc:
        emit(
            event="error",
            name=name,
            error=f"round {client.last_round}: {type(exc).__name__}: {exc}",
        )
    finally:
        client.close()


def _await_go(go: threading.Event) -> None:
    for line in sys.stdin:
        if line.strip() == "go":
            go.set()
            return


def worker_main(spec_path: Path) -> int:
    """A worker process: its share of the providers, one thread each; events on stdout."""
    setup_logging("warning")
    spec = json.loads(Path(spec_path).read_text())
    emit = _Emitter(sys.stdout)
    ds = load_dataset(spec["dataset"])  # once per worker: the providers share its arrays
    parts = max(1, min(int(spec["providers"]), len(ds.x_train)))
    gate = None
    if spec.get("gate_round") is not None:  # held there until the bench says "go"
        gate = (int(spec["gate_round"]), threading.Event())
        threading.Thread(target=_await_go, args=(gate[1],), daemon=True).start()
    threads = []
    poison = set(spec.get("poison", []))
    for path, index in zip(spec["configs"], spec["indices"], strict=True):
        cfg = load_provider_config(path)
        data = split_among_providers(ds.x_train, ds.y_train, parts, index % parts)
        client = (PoisonProvider if index in poison else BenchProvider)(cfg, data=data)
        client.gate = gate
        if isinstance(client, PoisonProvider):
            client.position = sorted(poison).index(index)
            client.poisoners = len(poison)
        threads.append(
            threading.Thread(target=_run_provider, args=(client, emit), name=cfg.name, daemon=True)
        )
    gc.freeze()  # the data set and the clients: no full collection walks them again
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit(event="exit")
    return 0


# ----------------------------------------------------------------------------- hostile actors


class _Counts:
    """Every hostile call: its kind, how it was answered, when it started (wall clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, float]] = []
        self.acting: set[int] = set()  # the actor threads that have begun a call
        self.changed = threading.Condition(self.lock)

    def begin(self) -> float:
        """An actor begins a call: its start time (wall clock)."""
        with self.lock:
            if threading.get_ident() not in self.acting:
                self.acting.add(threading.get_ident())
                self.changed.notify_all()
        return time.time()

    def wait_acting(self, actors: int, timeout: float) -> bool:
        """Whether ``actors`` threads have each begun a call within ``timeout`` seconds."""
        with self.lock:
            return self.changed.wait_for(lambda: len(self.acting) >= actors, timeout)

    def add(self, kind: str, outcome: str, started: float) -> None:
        with self.lock:
            self.calls.append((kind, outcome, started))

    def by_kind(self, until: float) -> dict[str, dict[str, int]]:
        """Outcomes per kind of the calls started by ``until``; later ones (the servers were
        stopping after the last round) under ``after_last_round``."""
        out: dict[str, dict[str, int]] = {}
        with self.lock:
            for kind, outcome, started in self.calls:
                key = kind if started <= until else "after_last_round"
                out.setdefault(key, {}).setdefault(outcome, 0)
                out[key][outcome] += 1
        return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def _outcome(exc: grpc.RpcError) -> str:
    """The status name; an unexpected one's details go to the hostile process's log."""
    code = exc.code()
    if code not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT):
        print(f"{time.time():.3f} {code.name}: {exc.details()}", file=sys.stderr, flush=True)
    return code.name


def _stalling(done: threading.Event, stop: threading.Event, slow: bool) -> Iterator[bytes]:
    """A request stream that sends nothing (silent) or a few header bytes now and then
    (slow), until the call is over."""
    while not (done.is_set() or stop.is_set()):
        if slow:
            yield b"\x0a\x04\x08\x01\x10\x01"  # a fragment of a ShareChunk header, repeated
        done.wait(1.0)


def _silent_actor(i: int, spec: dict[str, Any], counts: _Counts, stop: threading.Event) -> None:
    """SubmitShare streams from the intruder's certificate, alternately silent and slow, to H1
    and H2 in turn."""
    tls = TlsFiles.from_dir(spec["pki"], INTRUDER)
    channels = {role: make_channel(spec[role], tls, server_name=role) for role in ("h1", "h2")}
    c = 0
    try:
        while not stop.is_set():
            role = ("h1", "h2")[(c + i) % 2]
            slow = (c // 2) % 2 == 1
            kind = "slow_streams" if slow else "silent_streams"
            c += 1
            call = channels[role].stream_unary(_AGGREGATOR + "SubmitShare", None, None)
            done, began = threading.Event(), counts.begin()
            try:
                call(_stalling(done, stop, slow), timeout=60)
                outcome = "OK"
            except grpc.RpcError as exc:
                outcome = _outcome(exc)
            finally:
                done.set()
            if not (stop.is_set() and outcome == "CANCELLED"):
                counts.add(kind, outcome, began)
            stop.wait(spec["interval"])
    finally:
        for channel in channels.values():
            channel.close()


def _junk_actor(i: int, spec: dict[str, Any], counts: _Counts, stop: threading.Event) -> None:
    host, port = split_host_port(spec["gc"])
    while not stop.is_set():
        began = counts.begin()
        try:
            with socket.create_connection((host, port), timeout=2.0) as sock:
                sock.sendall(os.urandom(256))
                try:
                    outcome = "closed_by_server" if sock.recv(4096) == b"" else "answered"
                except TimeoutError:
                    outcome = "no_answer_in_2s"
                except ConnectionResetError:
                    outcome = "reset_by_server"
        except ConnectionRefusedError:
            outcome = "connection_refused"
        except OSError as exc:
            outcome = f"error_{type(exc).__name__}"
        counts.add("gc_port_junk", outcome, began)
        stop.wait(spec["interval"])


def _malformed_actor(i: int, spec: dict[str, Any], counts: _Counts, stop: threading.Event) -> None:
    """Requests that do not parse, to every Aggregator method, alternately with a provider's
    certificate and the intruder's, to H1 and H2."""
    names = spec["provider_names"]
    who = (names[i % len(names)], INTRUDER)
    channels = {
        (name, role): make_channel(
            spec[role], TlsFiles.from_dir(spec["pki"], name), server_name=role
        )
        for name in who
        for role in ("h1", "h2")
    }
    c = 0
    try:
        while not stop.is_set():
            name = who[c % 2]
            role = ("h1", "h2")[(c // 2 + i) % 2]
            method, shape = _MALFORMED_METHODS[(c // 4) % len(_MALFORMED_METHODS)]
            head = _MALFORMED_HEADS[(c // 24) % len(_MALFORMED_HEADS)]
            payload = head + os.urandom(8 + c % 32)
            c += 1
            channel, path = channels[(name, role)], _AGGREGATOR + method
            began = counts.begin()
            try:
                if shape == "unary":
                    channel.unary_unary(path, None, None)(payload, timeout=10)
                elif shape == "stream_out":
                    for _ in channel.unary_stream(path, None, None)(payload, timeout=10):
                        pass
                else:
                    channel.stream_unary(path, None, None)(iter([payload]), timeout=10)
                outcome = "OK"
            except grpc.RpcError as exc:
                outcome = _outcome(exc)
            kind = "malformed_as_intruder" if name == INTRUDER else "malformed_as_provider"
            counts.add(kind, outcome, began)
            stop.wait(spec["interval"])
    finally:
        for channel in channels.values():
            channel.close()


def hostile_main(spec_path: Path) -> int:
    """The hostile process: waits for "go" on stdin, runs the actors until "stop" (or end of
    input), prints the counts as one JSON object."""
    setup_logging("error")
    spec = json.loads(Path(spec_path).read_text())
    counts, stop = _Counts(), threading.Event()
    print(json.dumps({"event": "ready"}), flush=True)
    for line in sys.stdin:
        if line.strip() == "go":
            break
    else:
        return 0
    actors: list[Callable[[int, dict[str, Any], _Counts, threading.Event], None]] = [
        _silent_actor,
        _junk_actor,
        _malformed_actor,
    ]
    threads = [
        threading.Thread(target=a, args=(i, spec, counts, stop), daemon=True)
        for a in actors
        for i in range(spec["actors"])
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    # Once every actor is at work, the bench lets the measured rounds begin.
    acting = counts.wait_acting(len(threads), 60.0)
    print(json.dumps({"event": "acting", "ok": acting}), flush=True)
    until = math.inf
    for line in sys.stdin:
        words = line.split()
        if words and words[0] == "stop":
            until = float(words[1]) if len(words) > 1 else until
            break
    stop.set()
    for t in threads:
        t.join(15)
    result = counts.by_kind(until)
    print(
        json.dumps({"event": "result", "seconds": time.monotonic() - started, "counts": result}),
        flush=True,
    )
    return 0
