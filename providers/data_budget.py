"""The provider's side of its data set's budget file (spgc/privacy/budget.py; issue 32, item 4).

:class:`ProviderBudget` is what the client asks, at each point where privacy is spent:

- joining a run (:meth:`ProviderBudget.join`): the lifetime spent over the OTHER runs plus this
  run's whole budget (the plan's target epsilon) must stay within ``max_total_epsilon``; the
  run is then recorded;
- before a vector leaves (:meth:`~ProviderBudget.before_submit`): the same limit with this
  run's epsilon after its steps so far and this one; then the round is recorded (write-ahead);
- each ledger verified (:meth:`~ProviderBudget.after_ledgers`): its release entries at rounds
  this provider submitted to are recorded (a re-run round's two entries both count);
- ldp, before a noisy vector is drawn (:meth:`~ProviderBudget.before_noise_draw`): the
  provider's own count of its noisy vectors must stay within the plan's target epsilon (and
  the lifetime within ``max_total_epsilon``); the draw is counted first.

Every refusal is a :class:`ProviderRefusal` that names the figures and the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spgc.privacy.budget import (
    NO_NOISE,
    BudgetError,
    DatasetBudget,
    RunPlan,
    Spent,
    budget_path,
    dataset_sha256,
    legacy_dataset_sha256,
)
from spgc.providers.errors import ProviderRefusal
from spgc.settings.provider_config import ProviderConfig

__all__ = ["ProviderBudget"]

#: Relative slack on epsilon limits: the provider's accountant and the servers' may differ in
#: the last bits (the effective noise multiplier is std / sensitivity, recomputed here).
_SLACK = 1e-9


def _over(epsilon: float, limit: float) -> bool:
    return epsilon > limit * (1 + _SLACK)


class ProviderBudget:
    """One run's view of the data set's budget file."""

    def __init__(
        self, budget: DatasetBudget, cfg: ProviderConfig, run_id: str, plan: RunPlan
    ) -> None:
        self.budget = budget
        self.cfg = cfg
        self.run_id = run_id
        self.plan = plan

    @property
    def path(self) -> Path:
        """The budget file."""
        return self.budget.path

    @classmethod
    def join(
        cls, cfg: ProviderConfig, run_id: str, plan: RunPlan, x: np.ndarray, y: np.ndarray
    ) -> ProviderBudget:
        """Open the budget file of the data set (x, y), refuse a run that could pass
        ``max_total_epsilon`` over the data set's lifetime, and record the run."""
        try:
            digest, legacy = dataset_sha256(x, y), legacy_dataset_sha256(x, y)
            budget = DatasetBudget.open(
                budget_path(cfg.state_dir, cfg.budget_file, digest),
                digest,
                (budget_path(cfg.state_dir, cfg.budget_file, legacy), legacy),
            )
            others = budget.spent(exclude_run=run_id)
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None
        self = cls(budget, cfg, run_id, plan)
        limit = cfg.max_total_epsilon
        planned = plan.target_epsilon
        if limit is not None and planned is not None and _over(others.epsilon + planned, limit):
            raise ProviderRefusal(
                f"{self._earlier(others)}; run {run_id} may spend up to {planned:g} more: "
                f"{others.epsilon + planned:.4g} > max_total_epsilon {limit:g}"
            )
        try:
            budget.record_run(run_id, plan)
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None
        return self

    def _earlier(self, others: Spent) -> str:
        where = f"this data set (budget file {self.path})"
        if others.method == NO_NOISE:
            return (
                f"{where} was used by a run without noise ({others.runs} earlier run(s)): it "
                "has no differential privacy left"
            )
        return (
            f"{where} has spent epsilon {others.epsilon:.4g} (delta {others.delta:.3g}) over "
            f"{others.runs} earlier run(s)"
        )

    def _others(self) -> Spent:
        try:
            return self.budget.spent(exclude_run=self.run_id)
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None

    def before_submit(self, round_number: int, *, fresh: bool, release_index: int | None) -> None:
        """Before this round's vector leaves: refuse one that would pass max_total_epsilon
        over the lifetime, else record the round (fsynced) and return. ``fresh``: a vector
        not sent before (one for a round recorded before counts one step more: a re-run, or
        a restart that drew it again)."""
        try:
            limit = self.cfg.max_total_epsilon
            if limit is not None:
                steps = self.budget.projected_steps(
                    self.run_id, round_number, fresh=fresh, release_index=release_index
                )
                self._hold_to(limit, steps, f"round {round_number}")
            self.budget.record_submission(
                self.run_id,
                round_number,
                fresh=fresh,
                release_index=release_index,
            )
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None

    def _hold_to(self, limit: float, steps: int, what: str) -> None:
        others, mine = self._others(), self.plan.epsilon_after(steps)
        if _over(others.epsilon + mine, limit):
            raise ProviderRefusal(
                f"{what}: {self._earlier(others)}; {steps} step(s) of run {self.run_id} spend "
                f"{mine:.4g}: {others.epsilon + mine:.4g} > max_total_epsilon {limit:g}: "
                "leaving the run"
            )

    def after_ledgers(self, ledgers: list[list[int]]) -> None:
        """Record the most release entries a verified ledger holds at rounds this provider
        submitted to (every entry counts: a round run again has two); ``ledgers``: each
        verified ledger's release rounds (LedgerVerifier.release_rounds)."""
        try:
            mine = set(self.budget.rounds_submitted(self.run_id))
            most = max((sum(r in mine for r in rounds) for rounds in ledgers), default=0)
            if most:
                self.budget.record_ledger(self.run_id, most)
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None

    def others_note(self) -> tuple[float, str]:
        """(epsilon the other runs spent, a note naming them; "" when none)."""
        others = self._others()
        if others.runs == 0:
            return 0.0, ""
        return others.epsilon, f" on top of what {self._earlier(others)}"

    def prepare_noise_draw(self) -> None:
        """ldp: work out now (on joining) the epsilon the next draw's check needs, so that the
        check does not delay the round (a PLD answer takes a second or more; cached)."""
        try:
            self.plan.epsilon_after(self.budget.local_vectors(self.run_id) + 1)
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None

    def before_noise_draw(self, release_index: int | None) -> None:
        """ldp, before a noisy vector is drawn: refuse a draw past the run's budget (the
        plan's target epsilon) or past max_total_epsilon over the lifetime; count it first."""
        try:
            drawn = self.budget.local_vectors(self.run_id)
            steps = drawn + 1
            if self.plan.sampling.get("sampling") == "fixed" and release_index is not None:
                steps = max(steps, release_index + 1)
            eps = self.plan.epsilon_after(steps)
            target = self.plan.target_epsilon
            if target is not None and _over(eps, target):
                raise ProviderRefusal(
                    f"ldp: this provider has drawn {drawn} noisy vector(s) for run "
                    f"{self.run_id} (budget file {self.path}); one more would spend epsilon "
                    f"{eps:.4g} > the plan's target_epsilon {target:g}: leaving the run"
                )
            if self.cfg.max_total_epsilon is not None:
                self._hold_to(self.cfg.max_total_epsilon, steps, "ldp noisy vector")
            self.budget.record_local_vector(self.run_id)
        except BudgetError as exc:
            raise ProviderRefusal(str(exc)) from None


