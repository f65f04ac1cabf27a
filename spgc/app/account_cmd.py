"""`spgc account`: plan a training's privacy, or verify a run's privacy ledger (issue 13).

``--sigma S`` gives the epsilon of ``--steps`` Poisson-subsampled Gaussian steps at
``--sampling-rate`` and ``--delta``; ``--epsilon E`` instead gives the smallest noise multiplier
(noise std / L2 sensitivity) that keeps the whole training within E. Both call
``spgc.privacy.accounting`` (RDP or PLD via dp-accounting); nothing is computed here.

The human line rounds its figures up (4 significant digits for epsilon, 6 for the noise
multiplier): the safe direction, so a multiplier copied into a configuration never spends more
than planned. ``--json`` gives the unrounded values.

``--ledger FILE`` verifies a server's privacy ledger (``spgc.privacy.ledger``, docs/PRIVACY.md):
the hash
chain, every line's Ed25519 signature by the server, the other server's co-signature on every
release entry (two-server modes; each key pinned to its role with ``--keys h1=PEM h2=PEM``), and
epsilon re-accounted from the release entries with dp-accounting, independently of the server's
own count; given both servers' ledgers, it also holds them to each other and reports the worse
figure. ``--model FILE`` holds the ledgers to the head a released model or export names,
``--run-id`` to a run. ``--budget FILE`` prints a provider's budget file (``spgc.privacy.budget``).
Exit 0 when it verifies and is complete (closed, or holding ``--model``'s head); 1, naming the
line, when it does not verify (broken chain, bad signature, an under-reported epsilon, another
run, a model's head it lacks, ...); 2 for a usage error or a file that cannot be read; 3
(:data:`EXIT_INCOMPLETE`) when it verifies but later releases cannot be ruled out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from safetensors import SafetensorError

from spgc.learning.export import read_report
from spgc.privacy.accounting import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    epsilon_for,
    quiet_dp_accounting,
)
from spgc.privacy.budget import BudgetError, budget_summary, format_budget
from spgc.privacy.ledger_format import (
    ROLES,
    LedgerError,
    abort_line,
    public_key_hex,
    read_ledger_lines,
)
from spgc.privacy.ledger_pair import check_covers, compare_ledgers
from spgc.privacy.ledger_verify import verify_ledger
from spgc.privacy.noise_floor import FIGURES, FloorMultipliers, floor_multipliers
from spgc.protocol.modes import DEFAULT_SECURITY

__all__ = ["add_parser", "run"]

PROG = "spgc account"


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
_floor = _number(lambda v: 0 <= v < 1, "in [0, 1)")


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
        help="epsilon of a planned training, the noise multiplier for a target epsilon, or "
        "verify a run's privacy ledger",
        description="Plan a training's privacy: with --sigma, print the epsilon after --steps "
        "Poisson-subsampled Gaussian steps at --sampling-rate and --delta; with --epsilon, "
        "print the smallest noise multiplier (noise std / L2 sensitivity) that stays within it. "
        "Printed figures are rounded up; --json gives them unrounded. With --ledger, verify a "
        "server's privacy ledger (chain, signatures, epsilon re-accounted from its entries): "
        "exit 1 naming the line when it does not verify.",
    )
    # One question per call.
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
    question.add_argument(
        "--ledger",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a server's privacy ledger (state_dir/ledger.jsonl): verify its chain and "
        "signatures and re-account epsilon from its entries (takes no plan options); two "
        "files, both servers' ledgers of one run: also check that they hold the same releases "
        "(h2's may hold one more: a crash between the two entries) and report the higher count",
    )
    question.add_argument(
        "--budget",
        type=Path,
        metavar="FILE",
        help="a provider's budget file (its data set's privacy spent across runs): print what "
        "it holds, each run and the lifetime figure",
    )
    p.add_argument(
        "--model",
        type=Path,
        metavar="FILE",
        help="with --ledger: a released model or export (.safetensors, or its .json privacy "
        "report) of the run: the ledgers must hold the co-signed head it names (release count "
        "and hash), so releases up to it cannot be missing",
    )
    p.add_argument(
        "--run-id",
        metavar="ID",
        help="with --ledger: the run the ledgers must be of (an older run's pair is refused)",
    )
    p.add_argument(
        "--keys",
        nargs="+",
        metavar="ROLE=PEM",
        help="with --ledger: pin each server's Ed25519 signing key to its role, h1=PEM and "
        "h2=PEM (public or private PEM files): a ledger's own key must be the one pinned for "
        "its server, its peer's the one pinned for the other (two-server modes: give both)",
    )
    # Not argparse-required: --ledger takes these from the ledger, so run() checks them.
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
        default=None,  # rdp; None tells run() it was not given (--ledger names its own)
        help="rdp (Renyi DP, the default), pld (privacy loss distributions, tighter) or "
        "rdp_discrete (Renyi DP with the discrete Gaussian's Poisson subsampling proved "
        "rather than assumed as by the other two; looser)",
    )
    # --- noise_floor (issue 46): the plan's three figures ---
    p.add_argument(
        "--noise-floor",
        type=_floor,
        metavar="F",
        help="each server adds its own noise of variance F sigma^2 and the joint noise is "
        "(1 - F) sigma^2 (servers' noise_floor, modes spgc and preprocessed): print epsilon "
        "against everyone who sees the release, one curious server (what --sigma or --epsilon "
        "is for) and one server that deviates; needs --sensitivity-units and --coordinates",
    )
    p.add_argument(
        "--sensitivity-units",
        type=_positive,
        metavar="B",
        help="with --noise-floor: the L2 sensitivity in fixed-point units (the plan's "
        "l2_bound_units; the ledger's sensitivity_units)",
    )
    p.add_argument(
        "--coordinates",
        type=_steps,
        metavar="D",
        help="with --noise-floor: the released vector's coordinates (the model's trained "
        "parameters, one more with adaptive clipping)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _ceil_sig(value: float, digits: int) -> str:
    """``value`` rounded up to ``digits`` significant digits, formatted."""
    if not math.isfinite(value) or value <= 0:
        return f"{value:g}"
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
    # The 1e-12 shrink absorbs float error, so 1.1 (1.1e5 * scale = 110000.00000000001) stays 1.1.
    return f"{math.ceil(value * scale * (1 - 1e-12)) / scale:.{digits}g}"


def _refuse_ledger_flags(args: argparse.Namespace) -> None:
    """The options that only --ledger takes."""
    for flag in ("keys", "model", "run_id"):
        if getattr(args, flag, None) is not None:
            raise _AccountError(f"--{flag.replace('_', '-')} goes with --ledger")


def _check(args: argparse.Namespace) -> None:
    """What argparse could not require (see add_parser), and values set by callers of run()."""
    _refuse_ledger_flags(args)
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
    floor = getattr(args, "noise_floor", None)
    if floor is not None and floor > 0:
        if args.sensitivity_units is None or args.coordinates is None:
            raise _AccountError("--noise-floor needs --sensitivity-units and --coordinates")
    elif getattr(args, "sensitivity_units", None) or getattr(args, "coordinates", None):
        raise _AccountError("--sensitivity-units and --coordinates go with --noise-floor")
    if args.accountant is None:
        args.accountant = "rdp"
    if args.accountant not in ACCOUNTANTS:
        raise _AccountError(
            f"--accountant must be one of {', '.join(ACCOUNTANTS)}, got {args.accountant!r}"
        )


def _answer(args: argparse.Namespace) -> dict[str, Any]:
    common = (args.delta, args.sampling_rate, args.steps, args.accountant, "poisson")
    if args.sigma is not None:
        sigma, target = float(args.sigma), None
    else:
        target = float(args.epsilon)
        sigma = calibrate_noise_multiplier(target, *common)
        if floor_of(args) > 0:  # the target holds against one curious server, as servers do
            sigma *= sigma / _floor_multipliers(args, sigma).curious_server
    floor = _floor_answer(args, sigma) if floor_of(args) > 0 else None
    # For --epsilon this is what the calibrated multiplier really spends (<= the target).
    epsilon = epsilon_for(sigma, *common) if floor is None else floor["curious_server"]["epsilon"]
    if epsilon is None:
        epsilon = math.inf
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
        **({} if floor is None else {"noise_floor": floor}),
    }


def floor_of(args: argparse.Namespace) -> float:
    """--noise-floor, 0 when not given."""
    return float(getattr(args, "noise_floor", None) or 0.0)


def _floor_multipliers(args: argparse.Namespace, sigma: float) -> FloorMultipliers:
    return floor_multipliers(sigma, floor_of(args), args.sensitivity_units, args.coordinates)


#: Each figure's noise std on the release relative to the plan's sigma, as f gives it.
_STD_RATIO = {
    "everyone": lambda f: math.sqrt(1.0 + f),
    "curious_server": lambda f: 1.0,
    "deviating_server": math.sqrt,
}


def _floor_answer(args: argparse.Namespace, sigma: float) -> dict[str, Any]:
    """Per figure: the noise std it faces relative to sigma, the effective noise multiplier
    the accountant composes (spgc.privacy.noise_floor) and epsilon (None: infinite)."""
    f = floor_of(args)
    multipliers = _floor_multipliers(args, sigma).as_dict()
    out: dict[str, Any] = {
        "fraction": f,
        "sensitivity_units": args.sensitivity_units,
        "coordinates": args.coordinates,
    }
    for name in FIGURES:
        m = multipliers[name]
        eps = (
            epsilon_for(m, args.delta, args.sampling_rate, args.steps, args.accountant, "poisson")
            if m > 0
            else math.inf
        )
        out[name] = {
            "noise_std_ratio": _STD_RATIO[name](f),
            "noise_multiplier": m,
            "epsilon": eps if math.isfinite(eps) else None,
        }
    return out


_FIGURE_WORDS = {
    "everyone": "everyone who sees the release",
    "curious_server": "one curious server",
    "deviating_server": "one server that deviates",
}


def _floor_human(floor: dict[str, Any]) -> str:
    """One line per figure: noise std against the plan's sigma, multiplier, epsilon."""
    lines = [f"noise floor {floor['fraction']:g}, against:"]
    for name in FIGURES:
        fig = floor[name]
        eps = "inf" if fig["epsilon"] is None else _ceil_sig(fig["epsilon"], 4)
        lines.append(
            f"  {_FIGURE_WORDS[name]}: noise std x{fig['noise_std_ratio']:.4g} sigma, "
            f"effective noise multiplier {fig['noise_multiplier']:.6g}, epsilon {eps}"
        )
    return "\n".join(lines)


def _human(answer: dict[str, Any]) -> str:
    setting = (
        f"Poisson rate {answer['sampling_rate']:g}, delta {answer['delta']:g}, "
        f"{answer['accountant'].upper()}"
    )
    steps = f"after {answer['steps']} step{'s' if answer['steps'] != 1 else ''}"
    sigma = _ceil_sig(answer["noise_multiplier"], 6)
    floor = answer.get("noise_floor")
    tail = "" if floor is None else "\n" + _floor_human(floor)
    if answer["solved_for"] == "epsilon":
        eps = "inf" if answer["epsilon"] is None else _ceil_sig(answer["epsilon"], 4)
        return f"epsilon {eps} {steps} (sigma {sigma}, {setting}){tail}"
    return (
        f"noise multiplier {sigma} for epsilon {answer['target_epsilon']:g} {steps} ({setting})"
        + tail
    )


def _error(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run ``spgc account``; 0, or 2 with one line on stderr (--ledger: 1 when the ledger does
    not verify)."""
    if getattr(args, "ledger", None) is not None:
        return _run_ledger(args)
    if getattr(args, "budget", None) is not None:
        return _run_budget(args)
    try:
        _check(args)
        with quiet_dp_accounting():
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
    return f"the {args.accountant} accountant {what} for these values{hint}"


# ---------------------------------------------------------------------------- --ledger


def _check_ledger(args: argparse.Namespace, what: str = "--ledger") -> None:
    if args.sigma is not None or args.epsilon is not None:
        raise _AccountError(f"give exactly one of --sigma, --epsilon and {what}")
    given = [
        flag
        for flag, value in (
            ("--sampling-rate", args.sampling_rate),
            ("--steps", args.steps),
            ("--delta", args.delta),
            ("--accountant", args.accountant),
            ("--noise-floor", getattr(args, "noise_floor", None)),
            ("--sensitivity-units", getattr(args, "sensitivity_units", None)),
            ("--coordinates", getattr(args, "coordinates", None)),
        )
        if value is not None
    ]
    if given:
        raise _AccountError(
            f"{', '.join(given)} cannot be given with {what} (the file holds the plan)"
        )


def _pinned_key(path: Path) -> str:
    """The raw hex of the Ed25519 public key in a PEM file (public or private key)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise _AccountError(f"--keys {path}: {exc.strerror or exc}") from None
    key: Any
    try:
        if b"PRIVATE KEY" in data:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_pem_public_key(data)
    except (TypeError, ValueError):
        # The library's message could quote the file; say only what is wrong.
        raise _AccountError(f"--keys {path}: not a PEM key without a password") from None
    if not isinstance(key, (Ed25519PrivateKey, Ed25519PublicKey)):
        raise _AccountError(f"--keys {path}: not an Ed25519 key")
    return public_key_hex(key)


def _pinned_keys(items: list[str]) -> dict[str, str]:
    """``--keys h1=PEM h2=PEM``: role -> the hex public key pinned for it."""
    keys: dict[str, str] = {}
    for item in items:
        role, sep, path = item.partition("=")
        if not sep:
            raise _AccountError(
                f"--keys {item}: name each key's role: --keys h1=H1_KEY.pem h2=H2_KEY.pem"
            )
        if role not in ROLES:
            raise _AccountError(f"--keys {item}: the role must be h1 or h2, got {role!r}")
        if role in keys:
            raise _AccountError(f"--keys: {role} is given twice")
        keys[role] = _pinned_key(Path(path))
    if len(set(keys.values())) < len(keys):
        raise _AccountError("--keys: h1 and h2 are pinned to the same key; each server has its own")
    return keys


def _alone(report: Any, pinned: bool, complete: bool) -> list[str]:
    """What a ledger, as checked, cannot establish (said with every check): ``complete``,
    whether a closing entry or --model rules out later releases."""
    out = []
    if report.cosigned and not complete:
        out.append(
            "that no release followed its last entry: the run's closing entry is missing "
            "(cut off, or the run is not over): give --model FILE, the model it must cover, "
            "or a closed ledger"
        )
    elif not report.cosigned:
        out.append(
            "anything a second server would vouch for: a one-server mode has no co-signer, so "
            "this is the server's own record alone"
        )
    if not pinned:
        out.append(
            "who signed it: without --keys h1=PEM h2=PEM any key pair could have made this ledger"
        )
    return out


def _ledger_answer(
    path: Path, lines: list[bytes], report: Any, pinned: bool, complete: bool
) -> dict[str, Any]:
    """The answer on the ledger's ``lines`` as verified in ``report`` (read once: what is
    verified is what is shown)."""
    header = json.loads(lines[0])  # verified: the header object
    answer = report.as_dict()
    epsilon = report.epsilon
    dp = epsilon is not None
    finite = epsilon is not None and math.isfinite(epsilon)
    answer.update(
        {
            "ledger": str(path),
            "mode": header.get("mode"),
            "noise_multiplier": header.get("noise_multiplier"),
            "sampling": header.get("sampling"),
            "accountant": header.get("accountant") if dp else None,
            "max_batch_size": header.get("max_batch_size"),
            "feature_stats": header.get("feature_stats"),  # its release's plan, or None
            "differentially_private": dp,
            "epsilon": epsilon if finite else None,  # JSON has no Infinity
            "delta_unmodelled": (
                None if report.delta_reported is None else report.delta_reported - report.delta
            ),
            "signatures_valid": True,  # verify_ledger raised otherwise
            "signatures_checked": (
                "this server's key on every line and the peer server's on every release entry"
                if report.cosigned
                else "this server's key on every line (a one-server mode: no peer)"
            ),
            "complete": complete,
            "cannot_establish_alone": _alone(report, pinned, complete),
        }
    )
    return answer


def _ledger_human(a: dict[str, Any]) -> str:
    key = a["public_key"]
    lines = [
        f"ledger {a['ledger']}: verified",
        f"  run {a['run_id']}, server {a['server']}, mode {a['mode']}, backend "
        f"{a.get('backend') or 'gc'}, security {a.get('security') or DEFAULT_SECURITY}",
        f"  releases counted: {a['steps']} (release entries, every one counted), "
        f"{a['released']} with a released line",
    ]
    if not a["differentially_private"]:
        lines.append(f"  NOT differentially private: mode {a['mode']} adds no noise (no epsilon)")
    else:
        eps = "inf" if a["epsilon"] is None else _ceil_sig(a["epsilon"], 4)
        recorded = a["epsilon_recorded"]
        rec = "inf" if recorded is None else _ceil_sig(recorded, 4)
        if not a["steps"]:
            rec = "no release"  # no entry records an epsilon yet
        lines.append(
            f"  epsilon {eps} re-accounted from the entries ({str(a['accountant']).upper()}, "
            f"noise multiplier {a['noise_multiplier']:g}); the server recorded {rec}"
        )
        lines.append(f"  adjacency: {a.get('adjacency')} (the unit of privacy)")
        if a.get("feature_stats_releases"):
            stats = a.get("feature_stats") or {}
            lines.append(
                "  includes the feature statistics' release (standardize: true, release 0, "
                f"noise multiplier {stats.get('noise_multiplier', 0.0):g}), composed unsampled "
                "with the steps"
            )
        if a.get("noise_floor"):
            lines.append(_ledger_floor_human(a["noise_floor"]))
        schedule = (a.get("sampling") or {}).get("schedule")
        if schedule:
            phases = "; ".join(
                f"from release {int(r)}: noise multiplier {z:g}, rate {q:g}" for r, z, q in schedule
            )
            lines.append(f"  noise schedule (each release accounted with its phase): {phases}")
        if a["delta_reported"] is None:
            lines.append(f"  delta {a['delta']:g} (accountant)")
        else:
            capped = " and capped Poisson batches" if a.get("max_batch_size") else ""
            lines.append(
                f"  delta {a['delta_reported']:.12g} = {a['delta']:g} (accountant) + "
                f"{a['delta_unmodelled']:.4g} (sampler{capped}: (1 + e^epsilon) x their "
                "probability)"
            )
    lines.append(f"  noise samples: {a['noise_samples']}")
    lines.append(_clip_human(a.get("clip") or {}, a.get("clip_norms") or []))
    pinned = ", each pinned to its role by --keys" if a["keys_pinned"] else ""
    peer = a.get("peer_public_key")
    cosigned = (
        f"; every release co-signed by the peer server's key {peer[:16]}..."
        if peer
        else "; one-server mode: no peer co-signature"
    )
    lines.append(f"  signatures valid (this server's key {key[:16]}...{cosigned}{pinned})")
    closed = "closed (no release follows)" if a["closed"] else "not closed"
    if a.get("abort"):
        closed = "aborted by this server (it co-signs no release after it)"
    lines.append(f"  head after {a['steps']} release(s): {a['head'][:16]}..., {closed}")
    if a.get("abort"):
        lines.append(f"  {abort_line(a['abort'])}; signed by {a['server']} alone")
    return "\n".join(lines)


def _ledger_floor_human(floor: dict[str, Any]) -> str:
    """The ledger's noise floor and the three figures re-accounted from its entries (the
    epsilon above is the curious server's, the plan's guarantee)."""
    eps = floor.get("epsilon") or {}
    parts = [
        f"{_FIGURE_WORDS[name]} {'inf' if eps.get(name) is None else _ceil_sig(eps[name], 4)}"
        for name in FIGURES
    ]
    return f"  noise floor {floor['fraction']:g}: epsilon against " + "; ".join(parts)


def _clip_human(clip: dict[str, Any], norms: list[float]) -> str:
    """The clip rule and each release's clip norm (co-signed), in one line."""
    seen = ", ".join(f"{c:.4g}" for c in norms[:8]) + (", ..." if len(norms) > 8 else "")
    if clip.get("rule") == "decay":
        return (
            f"  clip decaying from {clip['initial_norm']:g} by {clip['rate']:g} a round to "
            f"{clip['floor']:g} (each release's checked against the rule); clip norms per "
            f"release: {seen or 'none yet'}"
        )
    if clip.get("rule") != "adaptive":
        return f"  clip norm {clip.get('clip_norm', 0):g} (fixed)"
    return (
        f"  clip adaptive (quantile {clip['target_quantile']:g}, learning rate "
        f"{clip['learning_rate']:g}): the update's noise multiplier "
        f"{clip['update_noise_multiplier']:.4g} and the count's noise "
        f"{clip['count_noise_std']:.4g} examples, accounted together as the noise multiplier "
        f"above; clip norms per release: {seen or 'none yet'}"
    )


def _alone_human(a: dict[str, Any]) -> str:
    return "\n".join(
        ["  this ledger alone cannot establish:"]
        + [f"  - {what}" for what in a["cannot_establish_alone"]]
    )


def _worst(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The figure for a run from its two ledgers: the worse of the two, field by field."""

    def high(key: str, infinite: bool) -> Any:
        values = [a[key] for a in answers]
        if any(v is None for v in values) and infinite:
            return None  # an infinite epsilon (JSON null) is the worst
        present = [v for v in values if v is not None]
        return max(present) if present else None

    dp = all(a["differentially_private"] for a in answers)
    return {
        "steps": max(a["steps"] for a in answers),
        "noise_samples": max(a["noise_samples"] for a in answers),
        "epsilon": high("epsilon", dp),
        "delta": high("delta", False),
        "delta_reported": high("delta_reported", False),
        "differentially_private": dp,
    }


def _run_budget(args: argparse.Namespace) -> int:
    """``--budget FILE``: what a provider's budget file holds; exit 2 for one that cannot be
    read or is damaged."""
    try:
        _check_ledger(args, "--budget")  # the file holds the plans
        _refuse_ledger_flags(args)
        with quiet_dp_accounting():
            summary = budget_summary(args.budget)
    except (_AccountError, BudgetError) as exc:
        return _error(str(exc))
    print(json.dumps(summary, allow_nan=False) if args.json else format_budget(summary))
    return 0


#: ``spgc account --ledger``: verified, but later releases cannot be ruled out (no closing
#: entry, no --model to cover).
EXIT_INCOMPLETE = 3


def _model_head(path: Path) -> tuple[str, int, str]:
    """(run id, release count, co-signed head) that a released model or export names."""
    try:
        report = read_report(path)
    except FileNotFoundError:
        raise _AccountError(f"--model {path}: no such file") from None
    except (OSError, ValueError, SafetensorError) as exc:
        raise _AccountError(f"--model {path}: {' '.join(str(exc).split())}") from None
    head = report.get("ledger_head")
    if not isinstance(head, dict) or not isinstance(head.get("releases"), int):
        raise _AccountError(
            f"--model {path}: its privacy report names no ledger head (ledger_head: a model "
            "published before ledger format 4)"
        )
    return str(report.get("run_id", "")), int(head["releases"]), str(head.get("chain", ""))


def _completeness(
    reports: list[Any], model: tuple[str, int, str] | None, run_id: str | None
) -> str:
    """What makes the count complete ("" when nothing does); LedgerError when the ledgers
    are not of the pinned run or do not cover the model."""
    for report in reports:
        if run_id is not None and report.run_id != run_id:
            raise LedgerError(f"the ledger is of run {report.run_id}, not of --run-id {run_id}")
        if model is not None:
            check_covers(report, *model)
    if model is not None:
        return f"it holds the head of the model ({model[1]} release(s))"
    if any(r.closed for r in reports):
        return "it is closed: a co-signed closing entry says no release follows"
    aborted = [r for r in reports if r.abort is not None]
    if aborted:
        # Every release needs both servers' signatures: one that stopped co-signs no more.
        return (
            f"it ends in {aborted[0].server}'s abort entry (round {aborted[0].abort['round']}): "
            f"{aborted[0].server} co-signs no release after it"
        )
    return ""


def _incomplete_line(n: int) -> str:
    which = "the ledgers hold" if n == 2 else "the ledger holds"
    return (
        f"{PROG}: later releases cannot be ruled out: {which} "
        "no closing entry; give --model FILE (the latest model or export of the run) to check "
        f"that they cover it (exit {EXIT_INCOMPLETE})"
    )


def _run_ledger(args: argparse.Namespace) -> int:
    try:
        _check_ledger(args)
        if len(args.ledger) > 2:
            raise _AccountError("--ledger takes one file, or the two servers' ledgers of a run")
        keys = None if args.keys is None else _pinned_keys(args.keys)
        model = None if args.model is None else _model_head(args.model)
    except _AccountError as exc:
        return _error(str(exc))
    answers, read, reports = [], [], []
    for path in map(Path, args.ledger):
        try:
            lines = read_ledger_lines(path)
        except OSError as exc:
            return _error(f"--ledger {path}: {exc.strerror or exc}")
        try:
            with quiet_dp_accounting():
                report = verify_ledger(lines, expected_keys=keys)
            complete = _completeness([report], model, args.run_id)
        except LedgerError as exc:
            message = " ".join(str(exc).split())
            print(f"{PROG}: ledger {path}: {message}", file=sys.stderr)
            return 1
        answers.append(_ledger_answer(path, lines, report, keys is not None, bool(complete)))
        read.append(lines)
        reports.append(report)
    if len(answers) == 1:
        if args.json:
            print(json.dumps(answers[0], allow_nan=False))
        else:
            print(_ledger_human(answers[0]) + "\n" + _alone_human(answers[0]))
            print(f"  complete: {complete}" if complete else "  complete: no")
        if not complete:
            print(_incomplete_line(1), file=sys.stderr)
            return EXIT_INCOMPLETE
        return 0
    try:
        compare_ledgers(*read)
    except LedgerError as exc:
        print(f"{PROG}: ledgers {args.ledger[0]} and {args.ledger[1]}: {exc}", file=sys.stderr)
        return 1
    complete = _completeness(reports, model, args.run_id)  # checked above, one by one
    worst = _worst(answers)
    for a, report in zip(answers, reports, strict=True):  # what the pair still cannot show
        a["complete"] = bool(complete)
        a["cannot_establish_alone"] = _alone(report, keys is not None, bool(complete))
    both = {
        "ledgers": answers,
        "consistent": True,
        **worst,
        "keys_pinned": keys is not None,
        "complete": bool(complete),
    }
    if args.json:
        print(json.dumps(both, allow_nan=False))
    else:
        _print_pair(answers, worst, keys is not None, complete)
    if not complete:
        print(_incomplete_line(2), file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


def _print_pair(answers: list[dict[str, Any]], worst: dict[str, Any], pinned: bool,
                complete: str) -> None:  # fmt: skip
    print("\n".join(_ledger_human(a) for a in answers))
    eps = "none (not differentially private)"
    if worst["differentially_private"]:
        eps = "inf" if worst["epsilon"] is None else _ceil_sig(worst["epsilon"], 4)
        if worst["delta_reported"] is not None:
            eps += f" at delta {worst['delta_reported']:.12g}"
    print(
        f"the two ledgers agree ({answers[0]['steps']} and {answers[1]['steps']} release "
        "entries, the same plan and releases field by field; h2's may hold one more as its "
        f"last, recorded just before a crash): the run counted {worst['steps']} release(s), "
        f"epsilon {eps} (the worse of the two)"
    )
    print(f"  complete: {complete}" if complete else "  complete: no")
    if not pinned:
        print(
            "  not established: who signed them: without --keys h1=PEM h2=PEM any two key "
            "pairs could have made this pair of ledgers"
        )
