"""``spgc server [precompute] --config server.yaml [--set key=value ...]``: one server daemon.

The same command as ``spgc-server`` and ``python -m spgc.servers``. ``precompute`` (mode
preprocessed) fills the noise pool instead of training: run it on both servers; H1 stops both
once the pool is full. Exit status: 0 when training finished, 2 for a configuration error, 1
for a failure during the run.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from spgc.common.logs import (
    interrupted_status,
    print_error,
    setup_logging,
    stop_like_ctrl_c_on_sigterm,
)
from spgc.learning.data import DATA_ERRORS
from spgc.protocol.modes import TRAINING_MODES
from spgc.servers.daemon import ServerDaemon
from spgc.servers.noise_pool import PoolError
from spgc.settings.config import ConfigError
from spgc.settings.config_files import add_daemon_arguments, load_server_config

PROG = "spgc server"
log = logging.getLogger("spgc.servers")


def build_parser(precompute: bool = False) -> argparse.ArgumentParser:
    """The daemon's options: the config file, ``--set`` for any key, a few common keys."""
    if precompute:
        p = argparse.ArgumentParser(
            prog=f"{PROG} precompute",
            description="Fill the noise pool of mode preprocessed (both servers, over the data "
            "link) and stop; training later takes its noise from it.",
        )
        p.add_argument(
            "--samples",
            type=int,
            default=0,
            metavar="N",
            help="unused samples to hold (default: pool_rounds rounds' worth)",
        )
    else:
        p = argparse.ArgumentParser(
            prog=PROG,
            description="Run one SPGC server daemon (H1 or H2; also `spgc-server`). Every "
            "configuration key is in `spgc config show server` and docs/CONFIG.md. "
            f"`{PROG} precompute --help`: fill the noise pool of mode preprocessed.",
        )
    add_daemon_arguments(p, "--set rounds=5 or --set tls.cert=h1.pem")
    p.add_argument("--role", type=int, choices=(1, 2), help="key role: 1 = H1 (garbler), 2 = H2")
    p.add_argument("--listen", metavar="HOST:PORT", help="key listen: the providers' port")
    p.add_argument(
        "--peer-listen", metavar="HOST:PORT", help="key peer_listen: the other server's port"
    )
    p.add_argument(
        "--peer-address", metavar="HOST:PORT", help="key peer_address: the other's peer_listen"
    )
    p.add_argument("--gc-address", metavar="HOST:PORT", help="key gc_address (circuit link)")
    p.add_argument("--mode", choices=TRAINING_MODES, help="key mode")
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="key insecure: plaintext on every link (development only)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run until training ends or SIGINT/SIGTERM; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    precompute = bool(argv) and argv[0] == "precompute"
    args = build_parser(precompute).parse_args(argv[1:] if precompute else argv)
    if precompute and args.samples < 0:
        print_error(PROG, "configuration error: --samples must be >= 0", argv)
        return 2
    try:
        cfg = load_server_config(
            args.config,
            args.overrides,
            role=args.role,
            listen=args.listen,
            peer_listen=args.peer_listen,
            peer_address=args.peer_address,
            gc_address=args.gc_address,
            mode=args.mode,
            insecure=args.insecure,
            log_level=args.log_level,
            log_format=args.log_format,
        )
    except ConfigError as exc:
        print_error(PROG, f"configuration error: {exc}", argv)
        return 2
    setup_logging(cfg.log_level, cfg.log_format)
    stop_like_ctrl_c_on_sigterm()  # until the daemon runs: start-up is seconds under load
    try:
        daemon = ServerDaemon(cfg, args.samples if precompute else None).start()
    # A pool made for other parameters, a model that cannot be built, a missing data set, ...
    except (ValueError, OSError, PoolError, *DATA_ERRORS) as exc:
        print_error(PROG, f"error: {exc}", fmt=cfg.log_format)
        return 2
    except KeyboardInterrupt as exc:
        signum, status = interrupted_status(exc)
        log.info("signal %d during start-up: stopped", signum)
        return status

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        daemon.stop_event.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # What start-up loaded (torch, the model, the plan) lives as long as the process: out of
    # the garbage collector's sight, a full collection no longer walks it (measured under
    # load: about 4% of a server's CPU went to collections).
    gc.freeze()
    while not daemon.wait(0.5) and not daemon.stop_event.is_set():
        pass
    if daemon.error is None and daemon.state.finished:
        daemon.linger()  # providers computing or polling slowly learn that training is over
    elif daemon.state.aborted is not None and not daemon.stop_event.is_set():
        daemon.linger_after_abort()  # the peer and the providers hear why the run stopped
    daemon.stop()
    return 1 if daemon.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
