"""One log format for every daemon: plain text by default, JSON lines with ``log_format: json``.

gRPC's C core writes its own lines (handshake failures, fork warnings) straight to stderr, in
another format and before Python logging exists; the daemons report those events themselves.
The core reads ``GRPC_VERBOSITY`` once, when grpc is imported, so :func:`quiet_grpc_core` runs
from ``spgc/__init__.py``, before anything imports grpc. A value the user set wins, and a
command line asking for ``--log-level debug`` keeps the core's lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence

__all__ = ["LOG_FORMAT", "quiet_grpc_core", "setup_logging"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _asks_for_debug(argv: Sequence[str]) -> bool:
    args = [a.lower() for a in argv]
    pairs = zip(args, [*args[1:], ""], strict=True)
    return any(
        (a == "--log-level" and b == "debug") or a in ("--log-level=debug", "log_level=debug")
        for a, b in pairs
    )


def quiet_grpc_core(argv: Sequence[str] | None = None) -> None:
    """Silence gRPC's C-core logging (errors only) unless debug logging was asked for."""
    if not _asks_for_debug(sys.argv if argv is None else argv):
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger once per process: ``level`` (debug, info, warning, error),
    ``fmt`` (text or json), to stderr. Libraries' chatter (grpc below warning, absl below
    error) is dropped unless ``level`` is debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    debug = level.lower() == "debug"
    for noisy in ("grpc", "urllib3", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    # dp-accounting logs, through absl, every RDP order it drops for not converging: dozens
    # of lines per calibration that change nothing (the accountant uses the other orders).
    logging.getLogger("absl").setLevel(logging.DEBUG if debug else logging.ERROR)
