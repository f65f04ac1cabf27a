"""Worker pairs on Ray: each server organisation spreads a round's circuit work over its own
Ray cluster (``pip install '.[ray]' in the checkout``).

A server with ``workers: K`` starts K Ray actors (:class:`LaneWorker`) on its cluster
(``ray_address``; empty: a local one). Worker i of H1 listens on an ephemeral port of its node;
H1's daemon names those addresses to H2's in a ``PairWorkers`` call on their control channel
(the mutually authenticated Peer gRPC service); worker i of H2 connects, with the server
certificates, so the two organisations share nothing but these paired
TLS links (the RayFed pattern). Each worker pair then runs one lane of every round
(:mod:`spgc.common.lanes`): the coordinates ``lane_ranges(d, K)[i]``, the sampler and the
reconstruction, on its own engine session. The daemons keep intake, agreement, accounting, the
model update and the ledger. Noise is addressed by coordinate (:mod:`spgc.privacy.noise`), so the
released vector is the same for any K.

No retries of anything that reveals: the actors run with ``max_restarts=0`` and
``max_task_retries=0``, so a lost worker fails the round (which the write-ahead ledger has
already counted) instead of being run again; the next round is a new round with fresh seeds.
A worker receives its server's round seed and its range of the summed shares over the
organisation's own cluster; nothing of one server ever reaches the other's cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import garbled_core
from spgc.common.memory import peak_rss_mb
from spgc.servers.gc_party import PartyLink, aggregate_range, noise_shares_range, range_align
from spgc.wire.transport import ray_cluster_endpoint

__all__ = [
    "LaneWorker",
    "RayLane",
    "WorkerLost",
    "WorkerTls",
    "connect_workers",
    "init_ray",
    "kill_worker",
    "ray_available",
    "ray_get",
    "shutdown_ray",
    "start_workers",
]

ACTOR_OPTIONS = {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 2}
"""No restart, no retry (a re-executed release would be a second, uncounted one); two threads
per actor so ``interrupt`` can reach a worker while it runs a range."""


class WorkerLost(garbled_core.ChannelError):
    """A circuit worker of this server died mid-round. Its link to the paired worker is gone,
    as when the peer is lost: the daemon pairs fresh workers and the round runs again (its
    release, written ahead, stays counted)."""


log = logging.getLogger(__name__)

LOCAL_START_ATTEMPTS = 3
"""How many times a private local cluster is started before giving up. Ray waits a fixed 30 s for
its new node to register; on a busy machine (two cores running tests or another job) the raylet
can take longer, and the next start usually succeeds."""

# Ray's words when a new local node misses that 30 s (ray/_private/node.py), or when its GCS
# server does not write its port file in time (the node's constructor too, before the raylet).
_NODE_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")

# Terminal colour codes in Ray's remote tracebacks.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def ray_available() -> bool:
    try:
        import ray  # noqa: F401  (an optional extra)
    except ImportError:
        return False
    return True


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError(
            "workers > 1 runs the circuit on Ray worker pairs: install the extra with "
            "pip install '.[ray]' in the checkout (or set workers: 1 for the embedded path)"
        ) from exc
    return ray


def ray_get(refs: Any) -> Any:
    """ray.get, through the optional import."""
    return _ray().get(refs)


def _starts_a_local_cluster(kwargs: dict[str, Any]) -> bool:
    return kwargs.get("address") in (None, "", "local")


def _stop_half_started_node(exc: BaseException) -> None:
    """Stop the processes of a local node whose start failed: ray.init raised from inside the
    node's constructor, so nothing else holds it and its raylet would go on competing for the
    CPU with the next attempt's."""
    tb = exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("self")
        if type(node).__name__ == "Node" and hasattr(node, "kill_all_processes"):
            with contextlib.suppress(Exception):
                node.kill_all_processes(check_alive=False, allow_graceful=False)
            return
        tb = tb.tb_next


def init_ray(attempts: int = LOCAL_START_ATTEMPTS, **kwargs: Any) -> None:
    """ray.init with ``kwargs``, through the optional import.

    Ray puts the driver's working directory on its workers' sys.path ahead of site-packages, so
    a driver started in an SPGC checkout would make the workers import the checkout's ``spgc/``
    (which has no ``servers``: it is installed as ``spgc.servers``). The driver connects from the
    directory that holds the installed packages instead, which is what the workers should see.

    A private local cluster whose node misses Ray's fixed 30 s start-up wait is stopped and
    started again, up to ``attempts`` times in all, with a warning each time; any other failure,
    and any failure to join a named cluster, is raised at once.
    """
    ray = _ray()
    installed = Path(garbled_core.__file__).resolve().parent.parent
    previous = Path.cwd()
    os.chdir(installed)
    try:
        for attempt in range(1, attempts + 1):
            try:
                ray.init(**kwargs)
                return
            except Exception as exc:
                retry = (
                    attempt < attempts
                    and _starts_a_local_cluster(kwargs)
                    and any(words in str(exc) for words in _NODE_START_TIMEOUTS)
                )
                if not retry:
                    raise
                log.warning(
                    "Ray's local node did not start within Ray's 30 s (attempt %d of %d; a busy "
                    "machine?): starting it again",
                    attempt,
                    attempts,
                )
                _stop_half_started_node(exc)
                with contextlib.suppress(Exception):
                    ray.shutdown()
    finally:
        os.chdir(previous)


def shutdown_ray() -> None:
    """ray.shutdown, when Ray is installed and running."""
    if ray_available():
        ray = _ray()
        if ray.is_initialized():
            ray.shutdown()


def kill_worker(actor: Any) -> None:
    """End a worker now (its link to its pair closes with it); already gone is fine."""
    with contextlib.suppress(Exception):
        _ray().kill(actor)


@dataclass(frozen=True)
class WorkerTls:
    """Certificate paths on the worker nodes (the daemon's), or insecure."""

    cert: str = ""
    key: str = ""
    ca: str = ""
    peer_name: str = ""
    insecure: bool = False

    def kwargs(self) -> dict[str, Any]:
        if self.insecure:
            return {"insecure": True}
        return {
            "tls": garbled_core.TlsConfig(self.cert, self.key, self.ca, peer_name=self.peer_name)
        }


class LaneWorker:
    """One lane of one server, as a Ray actor: its end of a paired data link and its engine
    session."""

    def __init__(
        self,
        role: str,
        tls: WorkerTls,
        scheme: str,
        ot_k: int,
        backend: str = "gc",
        trial_depth: int | None = None,
    ) -> None:
        self.role, self.tls, self.scheme, self.ot_k = role, tls, scheme, ot_k
        self.backend, self.trial_depth = backend, trial_depth
        self.listener: Any = None
        self.link: PartyLink | None = None

    def listen(self, host: str) -> tuple[str, int]:
        """Garbler side: an ephemeral port on this node; returns (node address, port)."""
        import ray

        self.listener = garbled_core.Listener(host, 0)
        local = host in ("127.0.0.1", "localhost")
        address = "127.0.0.1" if local else ray.util.get_node_ip_address()
        return address, int(self.listener.port)

    def accept(self, timeout: float) -> None:
        channel = self.listener.accept(timeout=timeout, **self.tls.kwargs())
        self.listener.close()
        self.listener = None
        self.link = self._open(channel)

    def connect(self, host: str, port: int, timeout: float) -> None:
        channel = garbled_core.Channel.connect(host, port, timeout=timeout, **self.tls.kwargs())
        self.link = self._open(channel)

    def _open(self, channel: Any) -> PartyLink:
        return PartyLink.open(
            self.role,
            channel,
            scheme=self.scheme,
            ot_k=self.ot_k,
            backend=self.backend,
            trial_depth=self.trial_depth,
        )

    def _linked(self) -> PartyLink:
        if self.link is None:
            raise RuntimeError("this worker has no data link to its pair")
        return self.link

    def aggregate_range(self, kwargs: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        y, info = aggregate_range(link=self._linked(), **kwargs)
        info["peak_rss_mb"] = self.peak_rss_mb()
        return y, info

    def noise_shares_range(self, kwargs: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        shares, info = noise_shares_range(link=self._linked(), **kwargs)
        info["peak_rss_mb"] = self.peak_rss_mb()
        return shares, info

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes per engine phase on this worker's link (benchmarks add them up)."""
        return self._linked().counters()

    def peak_rss_mb(self) -> float:
        """This worker process's peak resident memory so far (benchmarks: the idle baseline)."""
        return peak_rss_mb()

    def interrupt(self) -> None:
        if self.link is not None:
            self.link.channel.interrupt()

    def close(self) -> None:
        if self.link is not None:
            self.link.channel.close()
            self.link = None


class RayLane:
    """A remote lane for :func:`servers.gc_party.run_aggregate` and
    :func:`servers.noise_pool.produce_noise_shares`: the same ``aggregate_range``,
    ``noise_shares_range``, ``counters`` and ``interrupt`` as a local :class:`PartyLink`, run by
    a :class:`LaneWorker`."""

    def __init__(self, actor: Any, backend: str = "gc") -> None:
        self.actor = actor
        self.range_align = range_align(backend)  # where run_aggregate may split between lanes

    def aggregate_range(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        kwargs.pop("on_stage", None)  # fault hooks are the daemon's, not a worker's
        return self._call("aggregate_range", kwargs)

    def noise_shares_range(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        return self._call("noise_shares_range", kwargs)

    def counters(self) -> dict[str, dict[str, int]]:
        return self._call("counters")

    def _call(self, method: str, *args: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except ray.exceptions.RayActorError as exc:
            # One line, no Ray internals (they reach the providers' "stopped" messages).
            raise WorkerLost(
                f"a circuit worker was lost mid-round ({type(exc).__name__})"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)  # the worker's own error, e.g. its link closed
            if isinstance(cause, Exception):
                raise cause from None
            raise RuntimeError(_ANSI.sub("", str(exc)).splitlines()[0]) from None

    def interrupt(self) -> None:
        self.actor.interrupt.remote()


def check_ray_address(address: str, timeout: float) -> None:
    """Refuse, within ``timeout`` seconds and naming it, a cluster address nothing answers on:
    ray.init would wait on it for minutes with only Ray's own log lines. "" (a private local
    cluster), "local" and "auto" (Ray looks for one on this host) are Ray's to resolve."""
    endpoint = ray_cluster_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__  # a timeout has no strerror
        raise ConnectionError(
            f"no Ray cluster answers at ray_address {address} ({reason}; waited up to "
            f"{timeout:g} s)"
        ) from None


def start_workers(
    role: str,
    count: int,
    tls: WorkerTls,
    scheme: str = "threehalves",
    ot_k: int = garbled_core.DEFAULT_OT_K,
    ray_address: str = "",
    connect_timeout: float = 30.0,
    backend: str = "gc",
    trial_depth: int | None = None,
) -> list[Any]:
    """``count`` LaneWorker actors on this organisation's Ray cluster (started locally when
    ``ray_address`` is empty and Ray is not initialised yet; a named one must answer within
    ``connect_timeout`` seconds), each running ``backend``'s sessions on its link (gmw: its
    trial runs within ``trial_depth`` AND layers, the plan's; None: the session's default)."""
    ray = _ray()
    if not ray.is_initialized():
        check_ray_address(ray_address, connect_timeout)
        init_ray(
            address=ray_address or "local",  # "": a private cluster, never RAY_ADDRESS's
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    actor_cls = ray.remote(**ACTOR_OPTIONS)(LaneWorker)
    return [actor_cls.remote(role, tls, scheme, ot_k, backend, trial_depth) for _ in range(count)]


def connect_workers(
    garblers: Sequence[Any],
    evaluators: Sequence[Any],
    host: str,
    timeout: float = 30.0,
    backend: str = "gc",
) -> tuple[list[RayLane], list[RayLane]]:
    """Pair worker i of H1 with worker i of H2 (both clusters reachable from here: tests and
    benchmarks; the daemons do the same across organisations, H1 naming the addresses to H2 in a
    PairWorkers call on their control channel). Returns the lanes of each side."""
    ray = _ray()
    if len(garblers) != len(evaluators):
        raise ValueError("both servers need the same number of workers")
    addresses = ray.get([g.listen.remote(host) for g in garblers])
    accepted = [g.accept.remote(timeout) for g in garblers]
    ray.get(
        [e.connect.remote(h, p, timeout) for e, (h, p) in zip(evaluators, addresses, strict=True)]
    )
    ray.get(accepted)
    return [RayLane(g, backend) for g in garblers], [RayLane(e, backend) for e in evaluators]
