"""The one progress line: tqdm on a terminal, plain lines (or nothing) elsewhere."""

from __future__ import annotations

import io

from spgc.common.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    bar = Progress(3, "rounds", desc="p1", stream=out, interval=0.0)
    bar.update(1, eps="0.5")
    bar.update(1, eps="0.5")  # no move: no line
    bar.update(2, eps="0.7")
    bar.close(eps="0.9")
    assert out.getvalue().splitlines() == [
        "p1: 1/3 rounds, eps 0.5",
        "p1: 2/3 rounds, eps 0.7",
        "p1: 2/3 rounds, eps 0.9",
    ]


def test_interval_keeps_the_last_line() -> None:
    out = io.StringIO()
    bar = Progress(None, "samples", stream=out, interval=3600.0)
    for n in range(1, 6):
        bar.update(n)
    bar.close()
    assert out.getvalue().splitlines() == ["1 samples", "5 samples"]


def test_the_first_update_prints_just_after_boot(monkeypatch) -> None:
    """time.monotonic() counts from about boot: minutes after it, the first line still prints."""
    from spgc.common import progress

    monkeypatch.setattr(progress.time, "monotonic", lambda: 5.0)
    out = io.StringIO()
    bar = Progress(None, "samples", stream=out, interval=30.0)
    bar.update(1)
    assert out.getvalue().splitlines() == ["1 samples"]


def test_nothing_without_lines_and_a_bar_on_a_terminal() -> None:
    quiet = io.StringIO()
    bar = Progress(2, "rounds", stream=quiet, lines=False)
    bar.update(2)
    bar.close()
    assert quiet.getvalue() == ""
    term = Terminal()
    bar = Progress(4, "rounds", desc="p1", stream=term)
    bar.update(2, eps_spent="1.5")
    bar.close()
    text = term.getvalue()
    assert "\r" in text and "2/4" in text and "eps_spent=1.5" in text


def test_notes_are_lines_of_their_own_everywhere() -> None:
    out = io.StringIO()
    bar = Progress(2, "rows", stream=out, lines=False)
    bar.note("row 1: 123 B")
    bar.update(1)
    bar.close()
    assert out.getvalue() == "row 1: 123 B\n"  # the note, not the count (lines=False)
    term = Terminal()
    bar = Progress(2, "rows", stream=term)
    bar.update(1)
    bar.note("row 1: 123 B")
    bar.close()
    assert "row 1: 123 B\n" in term.getvalue()
