"""`spgc account`: plan a training's privacy with the library's accountant (issue 13).

``--sigma S`` gives the epsilon of ``--steps`` Poisson-subsampled Gaussian steps at
``--sampling-rate`` and ``--delta``; ``--epsilon E`` instead gives the smallest noise multiplier
(noise std / L2 sensitivity) that keeps the whole training within E. Both call
``spgc.accounting`` (RDP or PLD via dp-accounting); nothing is computed here.

The human line rounds its figures up (4 significant digits for epsilon, 6 for the noise
multiplier): the safe direction, so a multiplier copied into a configuration never spends more
than planned. ``--json`` gives the unrounded values.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from spgc.accounting import calibrate_noise_multiplier, epsilon_for

__all__ = ["add_parser", "run"]

PROG = "spgc account"
ACCOUNTANTS = ("rdp", "pld")


class _AccountError(ValueError):
    """A value the user must change: one line on stderr, exit 2."""


def _number(check: Callable[[float], bool], allowed: str) -> Callable[[str], float]:
    """An argparse type: a finite float satisfying ``check`` (``allowed`` says which)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        # float() accepts "nan" and "inf": neither is a meaningful privacy parameter.
        if not (math.isfinite(value) and check(value)):
            raise argparse.ArgumentTypeError(f"must be {allowed}: {text!r}")
        return value

    return parse


_positive = _number(lambda v: v > 0, "finite and > 0")
_rate = _number(lambda v: 0 < v <= 1, "in (0, 1]")
_delta = _number(lambda v: 0 < v < 1, "in (0, 1)")


def _steps(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))  # "10_000" and "10,000" read as ints
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def add_parser(subparsers: Any) -> None:
    """Add the ``account`` subcommand to ``spgc``'s subparsers."""
    p = subparsers.add_parser(
        "account",
        help="epsilon of a planned training, or the noise multiplier for a target epsilon",
        description="Plan a training's privacy: with --sigma, print the epsilon after --steps "
        "Poisson-subsampled Gaussian steps at --sampling-rate and --delta; with --epsilon, "
        "print the smallest noise multiplier (noise std / L2 sensitivity) that stays within it. "
        "Printed figures are rounded up; --json gives them unrounded.",
    )
    # One question per call. A future `--ledger FILE` (verify a signed ledger) joins this group.
    question = p.add_mutually_exclusive_group(required=True)
    question.add_argument(
        "--sigma",
        type=_positive,
        metavar="S",
        help="noise multiplier (noise std / L2 sensitivity): print epsilon",
    )
    question.add_argument(
        "--epsilon",
        type=_positive,
        metavar="E",
        help="target epsilon for the whole training: print the noise multiplier",
    )
    # Not argparse-required: a later --ledger takes these from the ledger, so run() checks them.
    p.add_argument(
        "--sampling-rate",
        type=_rate,
        metavar="Q",
        help="Poisson sampling rate per step, in (0, 1]; 1 means every example every step "
        "(required)",
    )
    p.add_argument("--steps", type=_steps, metavar="N", help="training steps, >= 1 (required)")
    p.add_argument("--delta", type=_delta, metavar="D", help="delta, in (0, 1) (required)")
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        default="rdp",
        help="rdp (Renyi DP, the default) or pld (privacy loss distributions, tighter)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _ceil_sig(value: float, digits: int) -> str:
    """``value`` rounded up to ``digits`` significant digits, formatted."""
    if not math.isfinite(value) or value <= 0:
        return f"{value:g}"
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    # The 1e-12 shrink absorbs float error, so 1.1 (1.1e5 * scale = 110000.00000000001) stays 1.1.
    return f"{math.ceil(value * scale * (1 - 1e-12)) / scale:.{digits}g}"


def _check(args: argparse.Namespace) -> None:
    """What argparse could not require (see add_parser), and values set by callers of run()."""
    if (args.sigma is None) == (args.epsilon is None):
        raise _AccountError("give exactly one of --sigma and --epsilon")
    missing = [
        flag
        for flag, value in (
            ("--sampling-rate", args.sampling_rate),
            ("--steps", args.steps),
            ("--delta", args.delta),
        )
        if value is None
    ]
    if missing:
        raise _AccountError(f"missing {', '.join(missing)} (all three are required)")
    if args.accountant not in ACCOUNTANTS:
        raise _AccountError(f"--accountant must be rdp or pld, got {args.accountant!r}")


def _answer(args: argparse.Namespace) -> dict[str, Any]:
    common = (args.delta, args.sampling_rate, args.steps, args.accountant, "poisson")
    if args.sigma is not None:
        sigma, target = float(args.sigma), None
    else:
        target = float(args.epsilon)
        sigma = calibrate_noise_multiplier(target, *common)
    # For --epsilon this is what the calibrated multiplier really spends (<= the target).
    epsilon = epsilon_for(sigma, *common)
    return {
        "solved_for": "epsilon" if target is None else "noise_multiplier",
        "epsilon": epsilon if math.isfinite(epsilon) else None,  # JSON has no Infinity
        "target_epsilon": target,
        "noise_multiplier": sigma,
        "delta": args.delta,
        "steps": args.steps,
        "sampling": "poisson",
        "sampling_rate": args.sampling_rate,
        "accountant": args.accountant,
    }


def _human(answer: dict[str, Any]) -> str:
    setting = (
        f"Poisson rate {answer['sampling_rate']:g}, delta {answer['delta']:g}, "
        f"{answer['accountant'].upper()}"
    )
    steps = f"after {answer['steps']} step{'s' if answer['steps'] != 1 else ''}"
    sigma = _ceil_sig(answer["noise_multiplier"], 6)
    if answer["solved_for"] == "epsilon":
        eps = "inf" if answer["epsilon"] is None else _ceil_sig(answer["epsilon"], 4)
        return f"epsilon {eps} {steps} (sigma {sigma}, {setting})"
    return f"noise multiplier {sigma} for epsilon {answer['target_epsilon']:g} {steps} ({setting})"


def _error(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run ``spgc account``; 0, or 2 with one line on stderr."""
    try:
        _check(args)
        answer = _answer(args)
    except (MemoryError, OverflowError) as exc:
        return _error(_too_large(args, exc))
    except ValueError as exc:  # the library's refusals, and _AccountError
        # numpy's refusal of a huge PLD grid is a ValueError that names no option.
        if "maximum allowed size" in str(exc).lower():
            return _error(_too_large(args, exc))
        return _error(str(exc))
    if args.json:
        print(json.dumps(answer, allow_nan=False))
    else:
        print(_human(answer))
    return 0


def _too_large(args: argparse.Namespace, exc: BaseException) -> str:
    # PLD's grid grows with the privacy loss (tiny sigma, many steps); RDP has no grid.
    hint = "; try --accountant rdp" if args.accountant == "pld" else ""
    what = "overflowed" if isinstance(exc, OverflowError) else "ran out of memory"
    return f"the {args.accountant.upper()} accountant {what} for these values{hint}"
