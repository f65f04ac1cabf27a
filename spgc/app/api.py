"""The Python API: run SPGC servers and providers from code instead of YAML and the CLI.

The configuration types are the daemons' own (:class:`ServerConfig`, :class:`ProviderConfig`,
docs/CONFIG.md lists their keys), so a config built here and a YAML file read with
:func:`load_server_config` / :func:`load_provider_config` are interchangeable.

- :func:`run_server` runs one server until training ends, like ``spgc server``, and returns
  its summary (rounds, test accuracy, epsilon, ...).
- :func:`run_provider` runs one provider until training ends, like ``spgc provider``.
- :func:`start_server` / :func:`finish_server` split :func:`run_server` in two, for code that
  runs both servers and the providers in one process (tests, notebooks): a started server
  keeps answering until it is finished, so providers never poll a server that has gone.

This module is the application layer (it imports both ``spgc.servers`` and
``spgc.providers``), which is why it is ``spgc.app.api`` and not part of ``spgc`` itself.
docs/API.md has a complete example.
"""

from __future__ import annotations

from typing import Any

import grpc

from spgc.providers.client import ProviderClient, ProviderRefusal, RoundReport
from spgc.servers.daemon import ServerDaemon
from spgc.settings.config import ConfigError, ServerConfig, TlsPaths
from spgc.settings.config_files import load_provider_config, load_server_config
from spgc.settings.provider_config import ProviderConfig

__all__ = [
    "ConfigError",
    "ProviderConfig",
    "ProviderRefusal",
    "RoundReport",
    "ServerConfig",
    "ServerDaemon",
    "TlsPaths",
    "finish_server",
    "load_provider_config",
    "load_server_config",
    "run_provider",
    "run_server",
    "start_server",
]


def _describe(exc: BaseException) -> str:
    """One line for an exception; gRPC errors print a multi-line debug string otherwise."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def start_server(config: ServerConfig, *, precompute: int | None = None) -> ServerDaemon:
    """Start one server daemon in background threads and return it, serving.

    Finish it with :func:`finish_server` (or ``daemon.stop()``). ``precompute`` (mode
    preprocessed): fill the noise pool to that many samples (0: ``pool_rounds`` rounds' worth)
    instead of training, as ``spgc server precompute``. RuntimeError when the daemon cannot
    start (an address in use, a noise pool made for other parameters, ...).
    """
    if not isinstance(config, ServerConfig):
        raise TypeError(
            f"config must be a ServerConfig (or load_server_config(FILE)), got "
            f"{type(config).__name__}"
        )
    try:
        return ServerDaemon(config, precompute).start()
    except (ValueError, OSError, RuntimeError) as exc:
        raise RuntimeError(f"{config.role_name} could not start: {_describe(exc)}") from exc


def finish_server(daemon: ServerDaemon, *, timeout: float | None = None) -> dict[str, Any]:
    """Wait until ``daemon``'s training is over, stop it and return its summary.

    The summary is the one ``summary_path`` receives (rounds, steps, test_accuracy, epsilon,
    delta, gc_bytes, history, ...). RuntimeError when the daemon failed or is still running
    after ``timeout`` seconds; the daemon is stopped either way, Ctrl-C included.
    """
    try:
        if not daemon.wait(timeout):
            raise RuntimeError(
                f"{daemon.cfg.role_name} did not finish within {timeout:g} s "
                f"(round {daemon.state.round} of {daemon.cfg.rounds})"
            )
    finally:
        daemon.stop()  # idempotent: also on KeyboardInterrupt, which then propagates
    if daemon.error is not None:
        raise RuntimeError(
            f"{daemon.cfg.role_name} failed: {_describe(daemon.error)}"
        ) from daemon.error
    summary = daemon.state.summary()
    if summary.get("failure"):
        raise RuntimeError(f"{daemon.cfg.role_name} failed: {summary['failure']}")
    return summary


def run_server(config: ServerConfig, *, precompute: int | None = None) -> dict[str, Any]:
    """Run one server (H1 or H2) until training ends, like ``spgc server``; returns its summary.

    Blocks; Ctrl-C (KeyboardInterrupt) stops the daemon cleanly and propagates. RuntimeError
    when the daemon cannot start or fails. It stops serving as soon as training is over, as
    the CLI does; to run providers in the same process, use :func:`start_server` and
    :func:`finish_server` instead.
    """
    return finish_server(start_server(config, precompute=precompute))


def run_provider(config: ProviderConfig) -> list[RoundReport]:
    """Run one provider until training ends (or ``max_rounds``), like ``spgc provider``.

    Returns one report per round taken part in. ProviderRefusal (a RuntimeError) when the
    servers' plan is weaker than this provider's privacy minimum or they disagree.
    """
    if not isinstance(config, ProviderConfig):
        raise TypeError(
            f"config must be a ProviderConfig (or load_provider_config(FILE)), got "
            f"{type(config).__name__}"
        )
    with ProviderClient(config) as client:
        return client.run()
