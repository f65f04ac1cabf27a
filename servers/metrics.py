"""What an operator scrapes and probes: Prometheus metrics and the HTTP health endpoints.

One :class:`ServerMetrics` per server daemon, on a registry of its own (two daemons in one
process, as in the tests, do not mix their figures), served over HTTP on ``metrics_port`` by
prometheus-client's WSGI app:

- ``/metrics``: the series below plus the standard process, platform and GC collectors;
- ``/healthz``: 200 while the process serves;
- ``/readyz``: 200 when the server can run a round (its peer connected, the plans agreed,
  training not over), else 503 with the reason in the body.

Series (all prefixed ``spgc_``): ``rounds_completed_total`` (published rounds),
``round_duration_seconds{phase}`` (intake, agree, circuit, update, checkpoint; ``circuit`` is the
noise exchange in dng and preprocessed), ``providers_in_round`` (the last round's agreed set),
``providers_dropped_total`` (shares received but left out because the other server lacked
them or held a half of another vector), ``requests_refused_total{reason}`` (every refusal of
a provider call or share, or of a Peer call from anyone but the other server, by gRPC status
name),
``shares_refused_total{reason}`` (shares received in full but left out of a round: reason
``norm`` for a norm proof the two servers did not accept, with verified inputs),
``peer_bytes_total{direction}`` (the data link, sent/received),
``shares_accepted_total{encoding}`` and ``share_bytes_received_total{encoding}`` (provider
shares accepted into a round and the bytes of their elements, uint64 or packed: the intake's
traffic, framing aside), ``epsilon_spent`` and
``epsilon_budget``, ``noise_pool_samples`` (preprocessed mode), ``test_accuracy`` and
``test_loss`` (where the server evaluates; a regression run also ``test_mse``, ``test_mae``
and ``test_r2``, and no accuracy), ``clip_norm`` (the last published round's, with adaptive
clipping; NaN otherwise), ``ready`` (1 when /readyz says ready),
``rounds_skipped_total`` (rounds ended without a release: too few providers, a lost peer),
``round`` and ``rounds_planned`` (the round in progress, counted from 0, and the plan's
``rounds``), ``releases_counted`` (the ledger's releases: failed and re-run rounds included, so
it may exceed the rounds completed), ``plans_declined_total`` (providers that refused the
plan), and ``info{role,mode,version}`` (1).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from spgc.servers.round_phases import RoundRecord
from spgc.wire import aggregation_pb2 as pb

__all__ = ["PHASES", "MetricsServer", "ServerMetrics"]

log = logging.getLogger(__name__)

#: The phases of ``spgc_round_duration_seconds`` and where each comes from in a round record.
PHASES: dict[str, tuple[str, ...]] = {
    "intake": ("intake",),
    "agree": ("agree",),
    # mode preprocessed: only a round that found its noise pool short has it
    "noise_wait": ("noise_wait",),
    "circuit": ("circuit", "exchange"),
    "update": ("update",),
    "checkpoint": ("checkpoint",),
}
#: Refusal reasons (gRPC status names) whose series exist before the first refusal.
COMMON_REFUSALS = (
    "UNAUTHENTICATED", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT",
    "FAILED_PRECONDITION", "ALREADY_EXISTS",
)  # fmt: skip
#: Share encodings (spgc.wire.messages.share_encoding_name) whose series exist from the start.
SHARE_ENCODINGS = ("uint64", "packed", "field", "seed")
#: Audit events that are a refused provider request (servers/audit.py).
REFUSAL_EVENTS = frozenset({"refused", "share_refused"})
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def _finite_or_nan(value: float | None) -> float:
    return math.nan if value is None or math.isinf(value) else float(value)


class ServerMetrics:
    """The series of one server (module docstring); ``epsilon`` and ``pool_samples`` are read
    at every scrape, the rest is updated by :meth:`observe_round` and :meth:`refused`."""

    def __init__(
        self,
        epsilon: Callable[[], float | None],
        epsilon_budget: float | None,
        pool_samples: Callable[[], int] | None = None,
        readiness: Callable[[], str | None] | None = None,
        progress: Callable[[], tuple[int, int]] | None = None,
        rounds_planned: int | None = None,
        identity: dict[str, str] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        r = self.registry
        self.rounds_completed = Counter(
            "spgc_rounds_completed", "Rounds published (noisy sum revealed, model updated)",
            registry=r,
        )  # fmt: skip
        self.round_duration = Histogram(
            "spgc_round_duration_seconds", "Seconds a round spent in each phase",
            ["phase"], buckets=_BUCKETS, registry=r,
        )  # fmt: skip
        self.providers_in_round = Gauge(
            "spgc_providers_in_round", "Providers in the last round's agreed set", registry=r
        )
        self.providers_dropped = Counter(
            "spgc_providers_dropped",
            "Providers whose share this server received but the round left out",
            registry=r,
        )
        self.requests_refused = Counter(
            "spgc_requests_refused", "Provider calls and shares refused, by gRPC status",
            ["reason"], registry=r,
        )  # fmt: skip
        for code in COMMON_REFUSALS:  # present from the start: rate() alerts see them at 0
            self.requests_refused.labels(code)
        self.peer_bytes = Counter(
            "spgc_peer_bytes", "Bytes on the data link to the other server",
            ["direction"], registry=r,
        )  # fmt: skip
        for direction in ("sent", "received"):
            self.peer_bytes.labels(direction)
        self.shares_accepted = Counter(
            "spgc_shares_accepted", "Provider shares accepted into a round, by encoding",
            ["encoding"], registry=r,
        )  # fmt: skip
        self.share_bytes = Counter(
            "spgc_share_bytes_received",
            "Bytes of accepted provider shares' elements (the intake's payload), by encoding",
            ["encoding"], registry=r,
        )  # fmt: skip
        self.shares_refused = Counter(
            "spgc_shares_refused",
            "Shares received but left out of their round, by reason (norm: the norm proof)",
            ["reason"], registry=r,
        )  # fmt: skip
        self.shares_refused.labels("norm")
        for encoding in SHARE_ENCODINGS:
            self.shares_accepted.labels(encoding)
            self.share_bytes.labels(encoding)
        self.epsilon_spent = Gauge(
            "spgc_epsilon_spent", "Privacy spent so far (epsilon at the run's delta)", registry=r
        )
        self.epsilon_spent.set_function(lambda: _finite_or_nan(epsilon()))
        self.epsilon_budget = Gauge(
            "spgc_epsilon_budget", "The run's epsilon budget (target_epsilon)", registry=r
        )
        self.epsilon_budget.set(_finite_or_nan(epsilon_budget))
        if pool_samples is not None:
            self.noise_pool_samples = Gauge(
                "spgc_noise_pool_samples", "Noise samples ready in the pool (preprocessed)",
                registry=r,
            )  # fmt: skip
            self.noise_pool_samples.set_function(pool_samples)
        if readiness is not None:
            self.ready = Gauge(
                "spgc_ready", "1 when the server can run a round (as /readyz), else 0", registry=r
            )
            self.ready.set_function(lambda: float(readiness() is None))
        self.test_accuracy = Gauge(
            "spgc_test_accuracy", "Test accuracy of the last published model", registry=r
        )
        self.test_loss = Gauge(
            "spgc_test_loss", "Test loss of the last published model", registry=r
        )
        # Regression runs (spgc.learning.losses): the same path, one gauge per metric.
        self.test_regression = {
            name: Gauge(f"spgc_{name}", f"Test {label} of the last published model", registry=r)
            for name, label in (("test_mse", "MSE"), ("test_mae", "MAE"), ("test_r2", "R^2"))
        }
        self.clip_norm = Gauge(
            "spgc_clip_norm", "Clip norm of the last published round (adaptive clipping)",
            registry=r,
        )  # fmt: skip
        # NaN until a model is evaluated (a round is published)
        for unknown in (
            self.test_accuracy,
            self.test_loss,
            self.clip_norm,
            *self.test_regression.values(),
        ):
            unknown.set(math.nan)
        self.rounds_skipped = Counter(
            "spgc_rounds_skipped", "Rounds ended without a release (too few providers, ...)",
            registry=r,
        )  # fmt: skip
        self.plans_declined = Counter(
            "spgc_plans_declined", "Providers that declined the run's plan", registry=r
        )
        if progress is not None:  # (round in progress, releases counted)
            self.round = Gauge("spgc_round", "The round in progress (counted from 0)", registry=r)
            self.round.set_function(lambda: progress()[0])
            self.releases_counted = Gauge(
                "spgc_releases_counted", "Releases the privacy ledger counts", registry=r
            )
            self.releases_counted.set_function(lambda: progress()[1])
        if rounds_planned is not None:
            self.rounds_planned = Gauge("spgc_rounds_planned", "The plan's rounds", registry=r)
            self.rounds_planned.set(rounds_planned)
        if identity is not None:
            self.info = Gauge(
                "spgc_info", "This server: role, mode and software version (always 1)",
                sorted(identity), registry=r,
            )  # fmt: skip
            self.info.labels(**identity).set(1)

    def observe_round(self, rec: RoundRecord) -> None:
        """One ended round (published or skipped)."""
        for phase, keys in PHASES.items():
            seconds = next((rec.seconds[k] for k in keys if k in rec.seconds), None)
            if seconds is not None:
                self.round_duration.labels(phase).observe(seconds)
        self.providers_in_round.set(len(rec.agreed))
        self.providers_dropped.inc(len(set(rec.received) - set(rec.agreed)))
        for direction, count in rec.peer_bytes.items():
            self.peer_bytes.labels(direction).inc(count)
        if rec.phase != pb.ROUND_PHASE_PUBLISHED:
            self.rounds_skipped.inc()
            return
        self.rounds_completed.inc()
        if rec.clip_norm:
            self.clip_norm.set(rec.clip_norm)
        if rec.test_accuracy is not None:
            self.test_accuracy.set(rec.test_accuracy)
        if rec.test_loss is not None:
            self.test_loss.set(rec.test_loss)
        for name, value in rec.test_metrics.items():
            if name in self.test_regression:
                self.test_regression[name].set(value)

    def share_accepted(self, encoding: str, payload_bytes: int) -> None:
        """One provider share in a round (a state share observer)."""
        self.shares_accepted.labels(encoding).inc()
        self.share_bytes.labels(encoding).inc(payload_bytes)

    def refused(self, reason: str) -> None:
        self.requests_refused.labels(reason).inc()

    def on_audit(self, event: str, entry: dict[str, Any]) -> None:
        """An audit log listener: every refusal (of a call or of a share) and every declined
        plan counts, and every share left out of a round for its norm proof."""
        if event in REFUSAL_EVENTS:
            self.refused(str(entry.get("code", "UNKNOWN")))
        elif event == "norm_proof_refused":
            self.shares_refused.labels("norm").inc()
        elif event == "plan_declined":
            self.plans_declined.inc()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.client_address[0], *args)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the daemon's exit


class MetricsServer:
    """The HTTP endpoints on ``host:port`` (port 0: any free one, see :attr:`port`), in a
    thread of their own. ``readiness()`` returns None when ready, else the reason."""

    def __init__(
        self, metrics: ServerMetrics, readiness: Callable[[], str | None], host: str, port: int
    ) -> None:
        metrics_app = make_wsgi_app(metrics.registry)

        def app(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                return _text(start_response, "200 OK", "ok")
            if path == "/readyz":
                problem = readiness()
                if problem is None:
                    return _text(start_response, "200 OK", "ready")
                return _text(start_response, "503 Service Unavailable", f"not ready: {problem}")
            if path in ("/metrics", "/"):
                return metrics_app(environ, start_response)
            return _text(start_response, "404 Not Found", "/metrics, /healthz or /readyz")

        try:
            self._httpd = make_server(
                host, port, app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise OSError(f"cannot bind the metrics port {host}:{port}: {exc}") from exc
        self.port = int(self._httpd.server_port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="spgc-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def _text(start_response: Callable, status: str, body: str) -> list[bytes]:
    data = (body + "\n").encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))]
    )
    return [data]
