"""One log format for every daemon: plain text by default, JSON lines with ``log_format: json``.

gRPC's C core writes its own lines (handshake failures, fork warnings) straight to stderr, in
another format and before Python logging exists; the daemons report those events themselves.
The core reads ``GRPC_VERBOSITY`` once, when grpc is imported, so :func:`quiet_grpc_core` runs
from ``spgc/__init__.py``, before anything imports grpc. A value the user set wins, and a
command line asking for ``--log-level debug`` keeps the core's lines. JSON logs (``--log-format
json``, ``--set log_format=json`` or ``log_format: json`` in the ``--config`` file) silence the
core entirely: its lines are not JSON, and any client, even one without a certificate, can make
the core write one per connection attempt.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path

import yaml

__all__ = [
    "LOG_FORMAT",
    "RepeatLimiter",
    "first_line",
    "interrupted_status",
    "listed",
    "print_error",
    "printable",
    "quiet_grpc_core",
    "setup_logging",
    "stop_like_ctrl_c_on_sigterm",
]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _command_line_value(argv: Sequence[str], flag: str, key: str = "") -> str | None:
    """What ``flag VALUE``, ``flag=VALUE`` or (with ``key``) ``--set key=VALUE`` gives on a
    command line, the last one winning; None when none does."""
    args = list(argv)
    value = None
    for a, b in zip(args, [*args[1:], ""], strict=True):
        if a == flag:
            value = b
        elif a.startswith(flag + "="):
            value = a.removeprefix(flag + "=")
        elif key and a.startswith(key + "="):
            value = a.removeprefix(key + "=")
    return value


def _asks_for_debug(argv: Sequence[str]) -> bool:
    return (_command_line_value(argv, "--log-level", "log_level") or "").lower() == "debug"


def _asks_for_json(argv: Sequence[str]) -> bool:
    """Whether this command line asks for JSON logs: on it (which wins), or in its --config
    file (read quietly here; the daemon reads and checks the file itself later)."""
    given = _command_line_value(argv, "--log-format", "log_format")
    if given is not None:
        return given == "json"
    path = _command_line_value(argv, "--config")
    if not path:
        return False
    try:
        with Path(path).open(encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("log_format") == "json"


def quiet_grpc_core(argv: Sequence[str] | None = None) -> None:
    """Silence gRPC's C-core logging: errors only, nothing with JSON logs (its lines are not
    JSON), all of it when debug logging was asked for."""
    args = sys.argv if argv is None else argv
    if _asks_for_debug(args):
        return
    os.environ.setdefault("GRPC_VERBOSITY", "NONE" if _asks_for_json(args) else "ERROR")


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
    # Python's warnings (a library's UserWarning, say) in the same format, not as raw lines.
    logging.captureWarnings(True)
    debug = level.lower() == "debug"
    for noisy in ("grpc", "urllib3", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
    # dp-accounting logs, through absl, every RDP order it drops for not converging: dozens
    # of lines per calibration that change nothing (the accountant uses the other orders).
    logging.getLogger("absl").setLevel(logging.DEBUG if debug else logging.ERROR)


def print_error(
    prog: str, message: str, argv: Sequence[str] | None = None, *, fmt: str = ""
) -> None:
    """A command's error before (or instead of) its logging: ``prog: message`` on stderr, or
    one JSON line when JSON logs were asked for (``fmt``, else the command line ``argv``)."""
    json_lines = fmt == "json" if fmt else _asks_for_json(sys.argv if argv is None else argv)
    if json_lines:
        record = logging.LogRecord(prog, logging.ERROR, "", 0, message, None, None)
        sys.stderr.write(_JsonFormatter().format(record) + "\n")
    else:
        sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()


def stop_like_ctrl_c_on_sigterm() -> None:
    """SIGTERM (kill, systemd, Kubernetes) ends the command the way Ctrl-C does: a
    KeyboardInterrupt whose argument is the signal number, for the exit status 128 + it."""

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signum)

    signal.signal(signal.SIGTERM, interrupt)


def interrupted_status(exc: KeyboardInterrupt) -> tuple[int, int]:
    """(signal number, exit status 128 + it) of an interruption (Ctrl-C: SIGINT)."""
    signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else int(signal.SIGINT)
    return signum, 128 + signum


def printable(text: str, limit: int = 1000) -> str:
    """``text`` safe for one log line: control characters (newlines, terminal escapes) as
    ``\\xNN`` escapes, cut to ``limit`` characters. For what a remote party wrote."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out if len(text) <= limit else out + "..."


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of what ``exc`` says (its class name if nothing), cut to ``limit``: a
    user's code failing, told in one line without its traceback."""
    text = (str(exc) or type(exc).__name__).strip().splitlines()[0]
    return text if len(text) <= limit else text[:limit] + "..."


def listed(items: Sequence[object], limit: int = 5) -> str:
    """The first ``limit`` items, comma-separated, and how many more there are."""
    shown = ", ".join(str(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class RepeatLimiter:
    """Lets one event per key through per ``window`` seconds: a peer repeating a refused call
    hundreds of times a second must not fill the log and the disk. :meth:`admit` says how
    many were held back since the last one let through, so nothing goes uncounted."""

    MAX_KEYS = 4096  # distinct keys remembered (addresses are unbounded); then the oldest go

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}  # key -> when one was last let through
        self._held: dict[Hashable, int] = {}  # key -> held back since

    def admit(self, key: Hashable) -> int | None:
        """None: hold this one back; else let it through, and this many were held back."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.window:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            if last is None and len(self._last) >= self.MAX_KEYS:
                oldest = min(self._last, key=self._last.__getitem__)
                del self._last[oldest]
                self._held.pop(oldest, None)
            self._last[key] = now
            return self._held.pop(key, 0)
