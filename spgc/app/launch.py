"""The console scripts ``spgc``, ``spgc-server`` and ``spgc-provider``.

The commands import torch and gRPC before they run, seconds on a cold disk. Ctrl-C in that
time would print Python's traceback; here it ends the command in one line, as it does once the
command runs (exit status 130). The handler is Python's own again before any command starts.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

from spgc.common.logs import print_error


def _interrupted_while_starting(signum: int, _frame: FrameType | None) -> None:
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "spgc"
    print_error(prog, "interrupted")
    raise SystemExit(128 + signum)


# Only where Ctrl-C would raise KeyboardInterrupt: a SIGINT the parent ignores (nohup, a
# background job of a script) stays ignored.
_PYTHONS_OWN = signal.getsignal(signal.SIGINT) is signal.default_int_handler
if _PYTHONS_OWN:
    signal.signal(signal.SIGINT, _interrupted_while_starting)

from spgc.app.cli import main as spgc  # noqa: E402  (after the handler: the slow imports)
from spgc.providers.__main__ import main as spgc_provider  # noqa: E402
from spgc.servers.__main__ import main as spgc_server  # noqa: E402

if _PYTHONS_OWN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

__all__ = ["spgc", "spgc_provider", "spgc_server"]
