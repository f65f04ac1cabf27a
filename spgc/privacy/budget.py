"""A data set's privacy budget across runs: the provider's budget file (issue 32, item 4).

A provider keeps one file per data set (named by :func:`dataset_sha256` of its training part)
and records in it, per run it took part in: the run's plan fields (what accounting it needs),
the rounds it submitted a vector for (written and fsynced BEFORE the vector leaves:
write-ahead, as the servers' ledgers), the most release entries a verified ledger of the run
held at those rounds, and, in ldp, the noisy vectors it drew. A run's steps are the most of
these counts; the file composes every run into the data set's lifetime figure:

- always by sequential composition: epsilons add, deltas add;
- where every run that used the data samples by Poisson and accounts with ``rdp`` or ``pld``,
  also by RDP composition of all their steps together (dp-accounting's RdpAccountant), at the
  sum of the runs' accountant deltas; the smaller epsilon is reported, naming its method (both
  are upper bounds);
- a run in a mode without noise (``only-mpc``, ``plain``) that used the data makes the lifetime
  epsilon infinite: the data set has no differential-privacy guarantee any more.

Each run's delta is :func:`spgc.privacy.accounting.reported_delta`, the one delta formula (a
provider's view: steps times the model's parameter count noise samples; every release of a
capped Poisson run carries the capped-batch term).

The file is JSON, replaced atomically (temporary file, fsync, rename, fsync of the directory)
under an exclusive ``fcntl`` lock on ``FILE.lock``, so two processes holding the same data set
never lose each other's updates. docs/PRIVACY.md, "A data set's budget across runs".
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import dp_accounting
import numpy as np
from dp_accounting import rdp

from spgc.common.durable import write_atomically
from spgc.privacy.accounting import (
    ACCOUNTANTS,
    PrivacyAccountant,
    capped_poisson,
    quiet_dp_accounting,
    reported_delta,
)
from spgc.privacy.feature_stats import StatsThenStepsAccountant

__all__ = [
    "FORMAT",
    "BudgetError",
    "DatasetBudget",
    "RunPlan",
    "RunSpend",
    "Spent",
    "budget_path",
    "budget_summary",
    "dataset_sha256",
    "default_state_dir",
    "format_budget",
    "legacy_dataset_sha256",
]

#: The budget file's format version.
FORMAT = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SAMPLING_KEYS = frozenset({"sampling", "sampling_rate", "sample_size", "population", "unit"})
#: Lifetime methods: how :meth:`DatasetBudget.spent` composed the runs.
SEQUENTIAL, RDP, NO_NOISE, NOTHING = "sequential", "rdp", "no noise", "none"


class BudgetError(ValueError):
    """A budget file that cannot be used (missing, unreadable, damaged, another data set's):
    the message names the file."""


# ------------------------------------------------------------------------------ where


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/spgc``, or ``~/.local/state/spgc`` when XDG_STATE_HOME is unset."""
    base = os.environ.get("XDG_STATE_HOME", "").strip()
    root = Path(base) if base else Path.home() / ".local" / "state"
    return root / "spgc"


def budget_path(state_dir: Path | None, budget_file: Path | None, dataset_hash: str) -> Path:
    """The budget file of a data set: ``budget_file`` if set, else
    ``<state_dir>/budget/<dataset_hash>.json`` (``state_dir`` None: :func:`default_state_dir`)."""
    if budget_file is not None:
        return Path(budget_file).expanduser()
    base = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
    return base / "budget" / f"{dataset_hash}.json"


def _canonical_rows(array: np.ndarray, name: str) -> np.ndarray:
    """``array``'s rows as float64 values, one row per line (C order): the same numbers give
    the same bytes whatever their stored type (-0.0 as 0.0, one NaN)."""
    a = np.asarray(array)
    if a.dtype.hasobject or a.dtype.kind not in "biuf":
        raise BudgetError(
            f"the data set's {name} holds {a.dtype} values: it cannot be named by its "
            "contents for the budget file; give real numbers"
        )
    if a.ndim == 0:
        raise BudgetError(f"the data set's {name} is a scalar, not rows")
    rows = a.astype(np.float64).reshape(len(a), -1) + 0.0  # + 0.0: -0.0 becomes 0.0
    rows[np.isnan(rows)] = np.nan
    return np.ascontiguousarray(rows.astype("<f8"))


def dataset_sha256(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 (hex) naming a data set by its rows as a multiset: each row's values (x,
    flattened) and label(s) (y) as float64, the rows sorted by those bytes, then hashed. The
    same rows in any order, stored as float32 or float64 (or integers of the same values),
    name one data set; a row more, less or changed names another (docs/PRIVACY.md)."""
    xs, ys = _canonical_rows(x, "x"), _canonical_rows(y, "y")
    if len(xs) != len(ys):
        raise BudgetError(f"the data set has {len(xs)} rows of x but {len(ys)} labels")
    rows = np.concatenate([xs, ys], axis=1)  # at least one label: rows are never empty
    # Each row one opaque record of its bytes; sorting them fixes one order for a multiset.
    records = np.sort(rows.view(np.dtype((np.void, rows.shape[1] * 8))).ravel())
    h = hashlib.sha256(b"spgc-dataset-v2")
    h.update(f"{len(rows)} rows, {xs.shape[1]} values, {ys.shape[1]} labels;".encode())
    h.update(records.tobytes())
    return h.hexdigest()


def legacy_dataset_sha256(x: np.ndarray, y: np.ndarray) -> str:
    """The name budget files had before :func:`dataset_sha256` (each array's dtype, shape
    and bytes in C order): a file under it is taken over, so no past run is forgotten."""
    h = hashlib.sha256(b"spgc-dataset-v1")
    for array in (x, y):
        a = np.ascontiguousarray(np.asarray(array))
        if a.dtype.hasobject:
            raise BudgetError(f"the data set holds Python objects (dtype {a.dtype})")
        h.update(f"{a.dtype.str}{list(a.shape)}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


# ------------------------------------------------------------------------------ one run


@dataclass(frozen=True)
class RunPlan:
    """What accounting one run's steps needs, as the provider accounts it.

    ``noise_multiplier``: the effective one (0: a mode without noise); ``sampling``: the
    accountant's sampling arguments (``{"sampling": "poisson", "sampling_rate": q}`` or
    ``{"sampling": "fixed", "sample_size": b, "population": n}``); ``delta``: the plan's
    accountant delta; ``num_parameters``: noise samples per step (d); ``target_epsilon``: the
    plan's budget for the run (None: none); ``stats_noise_multiplier``: with standardize, the
    feature statistics' release (the run's first release, composed unsampled with the steps;
    spgc.privacy.feature_stats), 0 without: the run's steps are then counted in releases."""

    mode: str
    noise_multiplier: float
    sampling: dict[str, Any]
    accountant: str
    delta: float
    max_batch_size: int
    num_parameters: int
    target_epsilon: float | None = None
    stats_noise_multiplier: float = 0.0

    @property
    def noisy(self) -> bool:
        return self.noise_multiplier > 0

    def as_json(self) -> dict[str, Any]:
        """As stored in the file (without stats_noise_multiplier when 0: a run without the
        statistics is stored as before the field existed)."""
        out = asdict(self)
        if not self.stats_noise_multiplier:
            del out["stats_noise_multiplier"]
        return out

    def accountant_for(self) -> PrivacyAccountant:
        """This run's accountant (only for a noisy run)."""
        if self.stats_noise_multiplier > 0:
            return StatsThenStepsAccountant(
                self.noise_multiplier, self.delta, method=self.accountant,
                unsampled=[self.stats_noise_multiplier], **self.sampling,
            )  # fmt: skip
        return PrivacyAccountant(
            self.noise_multiplier, self.delta, method=self.accountant, **self.sampling
        )

    def epsilon_after(self, steps: int) -> float:
        """Epsilon of ``steps`` steps of this run at its delta (inf: steps without noise)."""
        if steps <= 0:
            return 0.0
        if not self.noisy:
            return math.inf
        with _EPSILON_LOCK:  # threads asking the same answer: one computes, the rest read it
            return _epsilon(json.dumps(self.as_json(), sort_keys=True), steps)

    def delta_after(self, steps: int, epsilon: float) -> float:
        """The reported delta of ``steps`` steps at ``epsilon`` (1: no guarantee)."""
        if steps <= 0:
            return 0.0
        if not self.noisy or math.isinf(epsilon):
            return 1.0
        capped = steps if capped_poisson(self.sampling, self.max_batch_size) else 0
        samples = steps * self.num_parameters
        return min(1.0, reported_delta(self.delta, epsilon, samples, capped))

    @classmethod
    def from_json(cls, value: Any, where: str) -> RunPlan:
        """Read (and check) a plan stored in a budget file; BudgetError naming ``where``."""
        if not isinstance(value, dict):
            raise BudgetError(f"{where}: not an object")
        try:
            plan = cls(
                mode=_typed(value, "mode", str, where),
                noise_multiplier=float(_typed(value, "noise_multiplier", (int, float), where)),
                sampling=dict(_typed(value, "sampling", dict, where)),
                accountant=_typed(value, "accountant", str, where),
                delta=float(_typed(value, "delta", (int, float), where)),
                max_batch_size=_typed(value, "max_batch_size", int, where),
                num_parameters=_typed(value, "num_parameters", int, where),
                target_epsilon=_optional_float(value.get("target_epsilon"), where),
                stats_noise_multiplier=float(value.get("stats_noise_multiplier", 0.0)),
            )
        except (TypeError, ValueError) as exc:
            raise BudgetError(f"{where}: {exc}") from None
        plan.check(where)
        return plan

    def check(self, where: str) -> None:
        """BudgetError unless the fields can be accounted."""
        problem = None
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            problem = f"noise_multiplier {self.noise_multiplier} is not finite and >= 0"
        elif self.accountant not in ACCOUNTANTS:
            problem = f"accountant {self.accountant!r} is not one of {', '.join(ACCOUNTANTS)}"
        elif not set(self.sampling) <= _SAMPLING_KEYS or "sampling" not in self.sampling:
            problem = f"sampling {self.sampling!r} is not the accountant's sampling arguments"
        elif self.max_batch_size < 0 or self.num_parameters < 1:
            problem = "max_batch_size must be >= 0 and num_parameters >= 1"
        elif self.noisy:
            try:
                self.accountant_for()
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            raise BudgetError(f"{where}: {problem}")


@dataclass(frozen=True)
class RunSpend:
    """One run of the file, accounted."""

    run_id: str
    plan: RunPlan
    steps: int
    epsilon: float  # inf: steps without noise
    delta: float
    rounds_submitted: int
    ledger_releases: int
    local_vectors: int
    reruns: int


class Spent(NamedTuple):
    """The lifetime figure: ``method`` is "sequential", "rdp", "no noise" (a run without
    noise used the data: epsilon inf) or "none" (no run used it); ``runs``: runs composed."""

    epsilon: float
    delta: float
    method: str
    runs: int


_EPSILON_LOCK = threading.Lock()


@functools.lru_cache(maxsize=256)
def _epsilon(plan_json: str, steps: int) -> float:
    """A noisy plan's epsilon after ``steps`` (cached: a PLD answer takes a second or more, and
    the provider asks the same ones before every round)."""
    plan = RunPlan(**json.loads(plan_json))
    with quiet_dp_accounting():
        return plan.accountant_for().epsilon_after(steps)


def _new_entry(plan: RunPlan) -> dict[str, Any]:
    return {
        "plan": plan.as_json(),
        "first_recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rounds_submitted": [],
        "reruns": 0,
        "ledger_releases": 0,
        "local_vectors": 0,
        "max_release_index": None,
    }


def _entry_steps(entry: dict[str, Any], plan: RunPlan) -> int:
    """The steps a run counts: the most of its own record and the ledgers' (fixed batches:
    at least the highest round or release index + 1, which bound the epochs begun)."""
    rounds = entry["rounds_submitted"]
    steps = max(len(rounds) + entry["reruns"], entry["ledger_releases"], entry["local_vectors"])
    if plan.sampling.get("sampling") == "fixed":
        if rounds:
            steps = max(steps, max(rounds) + 1)
        if entry["max_release_index"] is not None:
            steps = max(steps, entry["max_release_index"] + 1)
    return steps


def _spend(run_id: str, entry: dict[str, Any], plan: RunPlan) -> RunSpend:
    steps = _entry_steps(entry, plan)
    epsilon = plan.epsilon_after(steps)
    return RunSpend(
        run_id,
        plan,
        steps,
        epsilon,
        plan.delta_after(steps, epsilon),
        len(entry["rounds_submitted"]),
        entry["ledger_releases"],
        entry["local_vectors"],
        entry["reruns"],
    )


def compose(spends: list[RunSpend]) -> Spent:
    """The lifetime figure of these runs (module docstring): sequential, or RDP composition
    where every run that used the data is Poisson + rdp/pld and that is smaller."""
    used = [s for s in spends if s.steps > 0]
    if not used:
        return Spent(0.0, 0.0, NOTHING, 0)
    if any(math.isinf(s.epsilon) for s in used):
        return Spent(math.inf, 1.0, NO_NOISE, len(used))
    best = Spent(
        sum(s.epsilon for s in used), min(1.0, sum(s.delta for s in used)), SEQUENTIAL, len(used)
    )
    delta = sum(s.plan.delta for s in used)
    if len(used) < 2 or not delta < 1 or not all(_poisson_rdp(s.plan) for s in used):
        return best
    accountant = rdp.RdpAccountant()
    for s in used:
        event = dp_accounting.PoissonSampledDpEvent(
            s.plan.sampling["sampling_rate"], dp_accounting.GaussianDpEvent(s.plan.noise_multiplier)
        )
        steps = s.steps
        if s.plan.stats_noise_multiplier > 0:  # its first release: the statistics, unsampled
            accountant.compose(dp_accounting.GaussianDpEvent(s.plan.stats_noise_multiplier))
            steps -= 1
        accountant.compose(event, steps)
    with quiet_dp_accounting():
        epsilon = float(accountant.get_epsilon(delta))
    if not epsilon < best.epsilon:
        return best
    samples = sum(s.steps * s.plan.num_parameters for s in used)
    capped = sum(s.steps for s in used if capped_poisson(s.plan.sampling, s.plan.max_batch_size))
    return Spent(epsilon, min(1.0, reported_delta(delta, epsilon, samples, capped)), RDP, len(used))


def _poisson_rdp(plan: RunPlan) -> bool:
    return plan.sampling.get("sampling") == "poisson" and plan.accountant in ("rdp", "pld")


# ------------------------------------------------------------------------------ the file


class DatasetBudget:
    """One data set's budget file. Every change re-reads the file under the lock, changes it
    and replaces it atomically (fsynced) before returning: what a method recorded is on disk."""

    def __init__(self, path: Path, dataset_hash: str, legacy_hash: str | None = None) -> None:
        self.path = Path(path)
        self.dataset_sha256 = dataset_hash
        self.legacy_sha256 = legacy_hash  # the same data set's name before (taken over)

    @classmethod
    def open(
        cls, path: Path | str, dataset_hash: str, legacy: tuple[Path, str] | None = None
    ) -> DatasetBudget:
        """The budget file at ``path`` for the data set ``dataset_hash`` (hex SHA-256), made
        (with its directory, mode 0700) when missing. ``legacy``: (the file, the name) the
        same data set had under :func:`legacy_dataset_sha256`; its runs are taken over (the
        old file is kept). BudgetError for a damaged file or one of another data set."""
        for digest in (dataset_hash, *(() if legacy is None else (legacy[1],))):
            if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
                raise BudgetError(f"budget file {path}: {digest!r} is not a hex SHA-256")
        budget = cls(Path(path), dataset_hash, None if legacy is None else legacy[1])
        old = None if legacy is None else Path(legacy[0])

        def take_over(data: dict[str, Any]) -> None:
            if old is not None and not data["runs"] and old != budget.path and old.is_file():
                past = read_budget_file(old)
                if past["dataset_sha256"] == budget.legacy_sha256:
                    data["runs"] = past["runs"]

        budget._update(take_over)
        return budget

    # -------------------------------------------------------------- recording

    def record_run(self, run_id: str, plan: RunPlan) -> None:
        """Record a run this data takes part in (again: a resume). BudgetError when the file
        holds the run with another plan."""
        plan.check(f"budget file {self.path}: run {run_id!r}")

        def change(data: dict[str, Any]) -> None:
            entry = data["runs"].get(run_id)
            if entry is None:
                data["runs"][run_id] = _new_entry(plan)
            elif entry["plan"] != plan.as_json():
                raise BudgetError(
                    f"budget file {self.path}: run {run_id!r} is recorded with another plan "
                    f"({_plan_difference(entry['plan'], plan.as_json())})"
                )

        self._update(change)

    def record_submission(
        self,
        run_id: str,
        round_number: int,
        *,
        fresh: bool = True,
        release_index: int | None = None,
    ) -> None:
        """Before a vector for ``round_number`` leaves: the round joins ``rounds_submitted``.
        ``fresh``: a vector not sent before; one for a round already recorded is one more
        step (``reruns``), whatever made it: the servers ran the round again, or this
        provider restarted and drew it again (the file is the only memory that survives).
        ``release_index``: the release number the round's release takes (fixed batches)."""

        def change(data: dict[str, Any]) -> None:
            entry = self._entry(data, run_id)
            rounds = set(entry["rounds_submitted"])
            if fresh and round_number in rounds:
                entry["reruns"] += 1
            entry["rounds_submitted"] = sorted(rounds | {int(round_number)})
            if release_index is not None:
                seen = entry["max_release_index"]
                entry["max_release_index"] = max(int(release_index), -1 if seen is None else seen)

        self._update(change)

    def record_ledger(self, run_id: str, releases_at_my_rounds: int) -> None:
        """A verified ledger of the run holds this many release entries at rounds this
        provider submitted to (the most seen is kept)."""

        def change(data: dict[str, Any]) -> None:
            entry = self._entry(data, run_id)
            entry["ledger_releases"] = max(entry["ledger_releases"], int(releases_at_my_rounds))

        self._update(change)

    def record_local_vector(self, run_id: str) -> int:
        """ldp: one more noisy vector drawn (recorded before it is drawn); returns the count."""
        counted = []

        def change(data: dict[str, Any]) -> None:
            entry = self._entry(data, run_id)
            entry["local_vectors"] += 1
            counted.append(entry["local_vectors"])

        self._update(change)
        return counted[0]

    # -------------------------------------------------------------- reading

    def runs(self, exclude_run: str | None = None) -> list[RunSpend]:
        """Every run of the file (but ``exclude_run``), accounted."""
        return _spends(self._read(), self.path, exclude_run)

    def run(self, run_id: str) -> RunSpend | None:
        """One run, accounted (None: not in the file)."""
        data = self._read()
        entry = data["runs"].get(run_id)
        return None if entry is None else _spends({"runs": {run_id: entry}}, self.path)[0]

    def rounds_submitted(self, run_id: str) -> list[int]:
        """The rounds of ``run_id`` this provider submitted to."""
        entry = self._read()["runs"].get(run_id)
        return [] if entry is None else list(entry["rounds_submitted"])

    def local_vectors(self, run_id: str) -> int:
        """ldp: the noisy vectors drawn for ``run_id``."""
        entry = self._read()["runs"].get(run_id)
        return 0 if entry is None else int(entry["local_vectors"])

    def projected_steps(
        self, run_id: str, round_number: int, *, fresh: bool, release_index: int | None = None
    ) -> int:
        """The run's steps once a vector for ``round_number`` is sent: one more for a fresh
        vector (a vector sent before, again, adds none); fixed batches: at least the round's
        (or release's) number + 1."""
        data = self._read()
        entry = self._entry(data, run_id)
        plan = RunPlan.from_json(entry["plan"], f"budget file {self.path}: run {run_id!r}")
        steps = _entry_steps(entry, plan) + (1 if fresh else 0)
        if plan.sampling.get("sampling") == "fixed":
            steps = max(steps, round_number + 1, -1 if release_index is None else release_index + 1)
        return steps

    def spent(self, exclude_run: str | None = None) -> Spent:
        """The lifetime figure over every run but ``exclude_run``."""
        return compose(self.runs(exclude_run))

    # -------------------------------------------------------------- the file itself

    def _entry(self, data: dict[str, Any], run_id: str) -> dict[str, Any]:
        entry = data["runs"].get(run_id)
        if entry is None:
            raise BudgetError(f"budget file {self.path}: run {run_id!r} is not recorded")
        return entry

    def _read(self) -> dict[str, Any]:
        data = read_budget_file(self.path)
        if data["dataset_sha256"] == self.legacy_sha256:
            data["dataset_sha256"] = self.dataset_sha256  # renamed when next written
        if data["dataset_sha256"] != self.dataset_sha256:
            raise BudgetError(
                f"budget file {self.path} is of data set {data['dataset_sha256']}, not of this "
                f"one ({self.dataset_sha256}): set budget_file to this data set's own file"
            )
        return data

    def _update(self, change: Callable[[dict[str, Any]], None]) -> None:
        with self._locked():
            if self.path.exists():
                data = self._read()
            else:
                data = {"format": FORMAT, "dataset_sha256": self.dataset_sha256, "runs": {}}
            change(data)
            _write_atomically(self.path, data)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            lock = self.path.with_name(self.path.name + ".lock")
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise BudgetError(
                f"budget file {self.path}: cannot be written ({exc.strerror}); set state_dir or "
                "budget_file to a writable place"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def _plan_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    key = next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
    return f"{key}: {old.get(key)!r} recorded, {new.get(key)!r} now"


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"
    try:
        write_atomically(path, text.encode())
    except OSError as exc:
        raise BudgetError(f"budget file {path}: cannot be written ({exc.strerror})") from None


def read_budget_file(path: Path | str) -> dict[str, Any]:
    """The checked contents of a budget file; BudgetError naming the file otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BudgetError(f"budget file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BudgetError(f"budget file {path}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise BudgetError(f"budget file {path}: not JSON (damaged?)") from None
    where = f"budget file {path}"
    if not isinstance(data, dict):
        raise BudgetError(f"{where}: not a JSON object")
    if data.get("format") != FORMAT:
        raise BudgetError(f"{where}: format {data.get('format')!r}; this version reads {FORMAT}")
    if not isinstance(data.get("dataset_sha256"), str) or not _HEX64.fullmatch(
        data["dataset_sha256"]
    ):
        raise BudgetError(f"{where}: dataset_sha256 is not a hex SHA-256")
    runs = data.get("runs")
    if not isinstance(runs, dict):
        raise BudgetError(f"{where}: runs is not an object")
    for run_id, entry in runs.items():
        _check_entry(entry, f"{where}: run {run_id!r}")
    return data


def _check_entry(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise BudgetError(f"{where}: not an object")
    RunPlan.from_json(entry.get("plan"), where)
    rounds = _typed(entry, "rounds_submitted", list, where)
    if not all(type(r) is int and r >= 0 for r in rounds) or rounds != sorted(set(rounds)):
        raise BudgetError(f"{where}: rounds_submitted is not a sorted list of distinct rounds")
    for key in ("reruns", "ledger_releases", "local_vectors"):
        if _typed(entry, key, int, where) < 0:
            raise BudgetError(f"{where}: {key} is negative")
    index = entry.get("max_release_index")
    if index is not None and (type(index) is not int or index < 0):
        raise BudgetError(f"{where}: max_release_index is not a release number")


def _typed(entry: dict[str, Any], key: str, kind: Any, where: str) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BudgetError(f"{where}: {key} is missing or not of the right type")
    return value


def _optional_float(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetError(f"{where}: target_epsilon is not a number")
    return float(value)


def _spends(data: dict[str, Any], path: Path, exclude_run: str | None = None) -> list[RunSpend]:
    out = []
    for run_id, entry in data["runs"].items():
        if run_id == exclude_run:
            continue
        plan = RunPlan.from_json(entry["plan"], f"budget file {path}: run {run_id!r}")
        out.append(_spend(run_id, entry, plan))
    return out


# ------------------------------------------------------------------------------ reports


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def budget_summary(path: Path | str) -> dict[str, Any]:
    """What a budget file holds, accounted, as JSON-able values (``spgc account --budget
    FILE``): the data set's hash, every run (steps, epsilon, delta; epsilon None without
    noise) and the lifetime figure. BudgetError for a missing or damaged file."""
    path = Path(path)
    data = read_budget_file(path)
    spends = _spends(data, path)
    lifetime = compose(spends)
    runs = []
    for s in spends:
        entry = data["runs"][s.run_id]
        runs.append(
            {
                "run_id": s.run_id,
                "first_recorded": entry.get("first_recorded"),
                "mode": s.plan.mode,
                "noise_multiplier": s.plan.noise_multiplier,
                "sampling": s.plan.sampling,
                "accountant": s.plan.accountant,
                "target_epsilon": s.plan.target_epsilon,
                "steps": s.steps,
                "rounds_submitted": s.rounds_submitted,
                "reruns": s.reruns,
                "ledger_releases": s.ledger_releases,
                "local_vectors": s.local_vectors,
                "epsilon": _finite(s.epsilon),
                "delta": s.delta if math.isfinite(s.epsilon) else None,
                "differentially_private": math.isfinite(s.epsilon),
            }
        )
    dp = math.isfinite(lifetime.epsilon)
    return {
        "budget_file": str(path),
        "format": data["format"],
        "dataset_sha256": data["dataset_sha256"],
        "runs": runs,
        "lifetime": {
            "epsilon": _finite(lifetime.epsilon),
            "delta": lifetime.delta if dp else None,
            "method": lifetime.method,
            "runs_used": lifetime.runs,
            "differentially_private": dp,
        },
    }


_METHODS = {
    SEQUENTIAL: "sequential composition: the runs' epsilons and deltas added",
    RDP: "RDP composition of every run's steps",
    NOTHING: "no run used the data",
}


def _sampling_text(sampling: dict[str, Any]) -> str:
    if sampling.get("sampling") == "poisson":
        if sampling.get("unit") == "provider":
            return f"provider-level DP, Poisson rate {sampling.get('sampling_rate'):g} per provider"
        return f"Poisson rate {sampling.get('sampling_rate'):g}"
    return f"fixed batches of {sampling.get('sample_size')} of {sampling.get('population')}"


def format_budget(summary: dict[str, Any]) -> str:
    """:func:`budget_summary` as text for a person (no trailing newline)."""
    lines = [
        f"budget file {summary['budget_file']}",
        f"data set sha256 {summary['dataset_sha256']}",
    ]
    if not summary["runs"]:
        lines.append("no run recorded")
    for run in summary["runs"]:
        counts = (
            f"{run['steps']} step(s): {run['rounds_submitted']} round(s) submitted"
            + (f" ({run['reruns']} run again)" if run["reruns"] else "")
            + f", {run['ledger_releases']} release(s) at them in the servers' ledgers"
            + (f", {run['local_vectors']} noisy vector(s) drawn" if run["local_vectors"] else "")
        )
        if run["differentially_private"]:
            figure = (
                f"epsilon {run['epsilon']:.6g}, delta {run['delta']:.6g}"
                if run["steps"]
                else "nothing spent"
            )
            plan = (
                f"{run['mode']}, noise multiplier {run['noise_multiplier']:.6g}, "
                f"{_sampling_text(run['sampling'])}, {run['accountant']}"
            )
        else:
            figure = "NOT differentially private (no noise)"
            plan = run["mode"]
        lines.append(f"run {run['run_id']} ({plan}): {counts}; {figure}")
    life = summary["lifetime"]
    if not life["differentially_private"]:
        lines.append(
            f"lifetime over {life['runs_used']} run(s): NOT differentially private (a run "
            "without noise used this data set)"
        )
    else:
        lines.append(
            f"lifetime over {life['runs_used']} run(s): epsilon {life['epsilon']:.6g}, delta "
            f"{life['delta']:.6g} ({_METHODS[life['method']]})"
        )
    return "\n".join(lines)
