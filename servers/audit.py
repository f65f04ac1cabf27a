"""The audit log: one JSON line per event an operator must be able to account for afterwards.

``state_dir/audit.jsonl`` (or the ``audit_log`` key), mode 0600, appended and flushed per line.
Every line has ``time`` (UTC, ISO 8601 with milliseconds), ``server`` (h1, h2 or single) and
``event``; then, where they apply, ``identity`` (a provider's or peer's certificate name, or
an address), ``round`` and ``reason``, and event-specific fields. Events:

========================  ==============================================================
``start``                 the daemon serves (``run_id`` if known, ``round``, ``resumed``)
``resume``                a checkpoint was continued (``round``, ``version``, ``releases``)
``step_back``             one round ahead of the peer: back to the previous checkpoint
``refused``               a call refused by a gate: a provider's (identity, limits), or a Peer
                          call from anyone but the other server (``method``, ``code``, ``reason``)
``share_refused``         a share refused by the intake or its checks (``round``, ``code``)
``identity_refused``      a provider call whose claimed identity (its ``provider_id``) is not
                          its certificate's name: ``identity`` (the certificate's),
                          ``claimed``, ``peer`` (the caller's address); refused
                          (PERMISSION_DENIED)
``circuit_refused``       a connection to the circuit port that did not authenticate
``provider_dropped``      a provider whose share reached this server but not both: left out
``norm_proof_refused``    verified inputs: a provider whose norm proof the two servers did
                          not accept (``reason``): its share left out of the round
``round_skipped``         a round without enough providers (no noise spent)
``peer_lost``             the other server stopped, restarted or stopped answering; the round
                          in progress was dropped (``round``) and this server went back to
                          its last checkpoint (``resume_round``) to wait for it
``peer_deviated``         the engine caught the other server deviating (security: malicious):
                          the run stopped, the abort is in this server's ledger (``round``,
                          ``reason``: the check, ``evidence``, ``evidence_digest``)
``peer_aborted``          the other server said it aborted the run, having caught this one
                          deviating (``round``, ``reason``: its words); the run stopped
``stop``                  the daemon stopped (``finished`` or ``failure``)
========================  ==============================================================

A refusal repeated by the same identity (or address) for the same reason within 10 s is counted
but not written: the next line written for it carries ``repeats``, how many were left out since
its last line (the metrics count every one). Reasons are told apart by their words (numbers
aside, so "round 5" and "round 6" are one reason): every new reason from an identity is written
at least once, up to ``REASONS_PER_KEY`` reasons per identity in a window; a caller inventing a
new reason on every call shares one key past that, so it cannot flood the log either. No secret
ever goes in: no share, seed, key or noise value; identities and reasons only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spgc.common.logs import RepeatLimiter

__all__ = ["AuditLog", "host_of"]

log = logging.getLogger(__name__)


def host_of(who: str) -> str:
    """Who caused an event, for a repeat key: a certificate name as is; an address without its
    port ("ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7"): every connection has a port of its own,
    and repeats count per host."""
    host, _, port = who.rpartition(":")
    return host if host and port.isdigit() else who


# Distinct reasons written per (event, repeat key) in one window; more share one key.
REASONS_PER_KEY = 8
_NUMBERS = re.compile(r"\d+(\.\d+)?")


def reason_kind(reason: Any) -> str:
    """What tells two refusals' reasons apart for the repeat key: their words, numbers aside."""
    return _NUMBERS.sub("#", " ".join(str(reason).split()))[:160]


class AuditLog:
    """Appends audit events to ``path`` (None: events go to the process log only)."""

    def __init__(self, path: Path | None, server: str) -> None:
        self.path = path
        self.server = server
        self._lock = threading.Lock()
        self._file: Any = None
        self._listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self._repeats = RepeatLimiter()
        # (event, repeat key) -> (window start, the reason kinds seen in it)
        self._reasons: dict[tuple[str, str], tuple[float, set[str]]] = {}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8")

    def record(self, event: str, *, repeat_key: str | None = None, **fields: Any) -> bool:
        """One event; ``fields`` with a None value are left out. With ``repeat_key`` (who
        caused it) the event is written at most once per 10 s per (event, key); the listeners
        see every one. Returns whether it was written (log it only then)."""
        now = time.time()
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
            + f".{int(now * 1000) % 1000:03d}Z",
            "server": self.server,
            "event": event,
            **{k: v for k, v in fields.items() if v is not None},
        }
        if repeat_key is not None:
            kind = self._reason_key(event, repeat_key, fields.get("reason"))
            held = self._repeats.admit((event, repeat_key, kind))
            if held is None:
                for listener in self._listeners:
                    listener(event, entry)
                return False
            if held:
                entry["repeats"] = held
        line = json.dumps(entry, sort_keys=True, default=str)
        log.debug("audit: %s", line)
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
        for listener in self._listeners:
            listener(event, entry)
        return True

    def _reason_key(self, event: str, repeat_key: str, reason: Any) -> str:
        """The reason's part of the repeat key: its kind, or "" past REASONS_PER_KEY kinds in
        one window from this key."""
        if reason is None:
            return ""
        kind, now = reason_kind(reason), time.monotonic()
        with self._lock:
            start, kinds = self._reasons.get((event, repeat_key), (now, set()))
            if now - start >= self._repeats.window:
                start, kinds = now, set()
            if kind not in kinds and len(kinds) >= REASONS_PER_KEY:
                kind = ""
            else:
                kinds.add(kind)
            full = len(self._reasons) >= RepeatLimiter.MAX_KEYS
            if full and (event, repeat_key) not in self._reasons:
                self._reasons.pop(next(iter(self._reasons)))  # the oldest key
            self._reasons[(event, repeat_key)] = (start, kinds)
        return kind

    def add_listener(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """``listener(event, entry)`` is called for every event, written or not (metrics)."""
        self._listeners.append(listener)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
