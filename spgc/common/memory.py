"""A process's peak resident memory, counted from its own exec.

The kernel's ``ru_maxrss`` (``getrusage`` and ``wait4`` alike) is not that figure on Linux: at
exec it keeps the peak of the memory the process had before, which after fork is its parent's.
A server started by a test worker that held 4 GB read as a 4 GB server. ``VmHWM`` in
``/proc/PID/status`` belongs to the address space the exec made, so it is used wherever it
exists; ``ru_maxrss`` only where there is no /proc (macOS, where it is in bytes).
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

__all__ = ["peak_rss_kb", "peak_rss_mb"]


def peak_rss_kb(pid: int | str = "self") -> int | None:
    """The peak resident set of process ``pid`` (default this one) in KiB, from ``VmHWM``;
    None where /proc has no such figure (the process is gone, or a zombie, or no /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB since its exec."""
    kb = peak_rss_kb()
    if kb is not None:
        return kb / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024
