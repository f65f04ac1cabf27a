"""Progress of long work, the same way everywhere (provider rounds, noise precomputation, long
benchmarks): a tqdm line rewritten in place when the stream is a terminal; otherwise a plain
line when the count moves, at most every ``interval`` seconds (and always the last), so log
files and pipes get readable lines instead of carriage returns (``lines=False``: nothing, where
log lines already say the same). :func:`terminal_logging` keeps log lines above the bar.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["Progress", "terminal_logging"]


class Progress:
    """``Progress(total, "rounds")``; :meth:`update` with the new count and what to show
    beside it; :meth:`close` at the end. ``total`` None: open-ended (no percentage)."""

    def __init__(
        self,
        total: int | None,
        unit: str,
        desc: str = "",
        stream: TextIO | None = None,
        interval: float = 30.0,
        lines: bool = True,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.unit, self.desc, self.interval = total, unit, desc, interval
        self.lines = lines
        self.count = 0
        # (count, monotonic time) of the last line; None: none yet, so the first update prints
        # (monotonic time starts near 0 at boot: "0.0" would hold it back on a fresh machine)
        self._printed: tuple[int, float | None] = (-1, None)
        self._pending: dict[str, Any] = {}
        self._bar: Any = None
        if _is_terminal(self.stream):
            self._bar = tqdm(
                total=total, unit=f" {unit}", desc=desc or None, file=self.stream, leave=True,
                dynamic_ncols=True,
            )  # fmt: skip

    def update(self, count: int, **shown: Any) -> None:
        """The count reached ``count``; ``shown``: name=value pairs beside it."""
        step, self.count = count - self.count, count
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(step)
            return
        now = time.monotonic()
        last = self._printed[1]
        if count != self._printed[0] and (last is None or now - last >= self.interval):
            self._line(shown)
            self._printed = (count, now)
        self._pending = shown

    def note(self, text: str) -> None:
        """A line of its own (a finished item): above the progress line on a terminal, a
        plain line elsewhere (whatever ``lines`` says)."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, **shown: Any) -> None:
        """The end: the last state is always shown."""
        if self._bar is not None:
            if shown:
                self._bar.set_postfix(shown, refresh=False)
            self._bar.close()
            return
        if self.count != self._printed[0] or shown:
            self._line(shown or self._pending)

    def _line(self, shown: dict[str, Any]) -> None:
        if not self.lines:
            return
        of = "" if self.total is None else f"/{self.total}"
        extra = "".join(f", {k} {v}" for k, v in shown.items())
        head = f"{self.desc}: " if self.desc else ""
        self.stream.write(f"{head}{self.count}{of} {self.unit}{extra}\n")
        self.stream.flush()


def terminal_logging(stream: TextIO | None = None) -> contextlib.AbstractContextManager:
    """On a terminal, log lines go through tqdm (printed above a progress line, not through
    it); elsewhere nothing changes."""
    if _is_terminal(stream if stream is not None else sys.stderr):
        return logging_redirect_tqdm()
    return contextlib.nullcontext()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
