"""``python -m spgc.servers [precompute] --role 1|2 --config server.yaml [--set k=v ...]``: one
daemon (``spgc server ...`` is the same). ``precompute`` (mode preprocessed) fills the noise pool
instead of training: run it on both servers; H1 stops both once the pool is full."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from spgc.config import ConfigError, load_server_config
from spgc.modes import TRAINING_MODES
from spgc.servers.daemon import ServerDaemon
from spgc.servers.noise_pool import PoolError


def build_parser(precompute: bool = False) -> argparse.ArgumentParser:
    """Flags: the few common ones explicitly, every other key through ``--set``."""
    if precompute:
        p = argparse.ArgumentParser(
            prog="spgc server precompute",
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
        p = argparse.ArgumentParser(prog="python -m spgc.servers", description="SPGC server daemon")
    p.add_argument("--config", type=Path, help="YAML configuration file")
    p.add_argument("--role", type=int, choices=(1, 2), help="1 = H1 (garbler), 2 = H2")
    p.add_argument("--listen", help="host:port for providers and the peer's control calls")
    p.add_argument("--peer-address", help="the other server's listen address")
    p.add_argument("--gc-address", help="GC data link: H1 listens here, H2 dials it")
    p.add_argument("--mode", choices=TRAINING_MODES)
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="plaintext on every link (development only)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any configuration key (repeatable), e.g. --set rounds=5",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run until training ends or SIGINT/SIGTERM; exit 0 on success, 1 on failure."""
    argv = list(sys.argv[1:] if argv is None else argv)
    precompute = bool(argv) and argv[0] == "precompute"
    args = build_parser(precompute).parse_args(argv[1:] if precompute else argv)
    if precompute and args.samples < 0:
        print("configuration error: --samples must be >= 0", file=sys.stderr)
        return 2
    try:
        cfg = load_server_config(
            args.config,
            args.overrides,
            role=args.role,
            listen=args.listen,
            peer_address=args.peer_address,
            gc_address=args.gc_address,
            mode=args.mode,
            insecure=args.insecure,
        )
    except (ConfigError, OSError) as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    try:
        daemon = ServerDaemon(cfg, args.samples if precompute else None).start()
    except (ValueError, OSError, PoolError) as exc:  # a pool made for other parameters, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("spgc.servers").info("signal %d: shutting down", signum)
        daemon.stop_event.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not daemon.wait(0.5) and not daemon.stop_event.is_set():
        pass
    daemon.stop()
    return 1 if daemon.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
