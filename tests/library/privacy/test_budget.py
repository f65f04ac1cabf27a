"""A data set's privacy budget across runs (issue 32, items 4 and 5): spgc/privacy/budget.py, and
the
provider that keeps it (providers/data_budget.py, providers/local_noise.py).

The budget file lives under $XDG_STATE_HOME, which conftest.py points at each test's own
directory.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from helpers import run_in_process
from test_provider_client import MODEL as FAKE_MODEL
from test_provider_client import (
    FakeAggregator,
    FakeServer,
    provider_config,
    training_config,
)
from test_server_daemon import pki as pki  # the module's fixture: certificates for h1, h2, p1..p3
from test_server_daemon import start_pair
from test_user_plans import provider_config as daemon_provider_config

from spgc.learning.data import load_dataset
from spgc.privacy.accounting import PrivacyAccountant, reported_delta
from spgc.privacy.budget import (
    BudgetError,
    DatasetBudget,
    RunPlan,
    budget_path,
    budget_summary,
    dataset_sha256,
    default_state_dir,
    format_budget,
    legacy_dataset_sha256,
    read_budget_file,
)
from spgc.providers.client import ProviderClient, ProviderRefusal
from spgc.providers.data_budget import ProviderBudget
from spgc.settings.config_files import load_provider_config
from spgc.wire import aggregation_pb2 as pb

H = "ab" * 32  # a data set's hash
POISSON = {"sampling": "poisson", "sampling_rate": 0.1}


def plan(**changes: Any) -> RunPlan:
    fields: dict[str, Any] = {
        "mode": "spgc",
        "noise_multiplier": 1.0,
        "sampling": dict(POISSON),
        "accountant": "rdp",
        "delta": 1e-5,
        "max_batch_size": 0,
        "num_parameters": 62,
        "target_epsilon": 8.0,
    }
    fields.update(changes)
    return RunPlan(**fields)


def eps(p: RunPlan, steps: int) -> float:
    return PrivacyAccountant(
        p.noise_multiplier, p.delta, method=p.accountant, **p.sampling
    ).epsilon_after(steps)


# ----------------------------------------------------------------------------- the file


def test_the_file_round_trips_and_counts_the_most_of_its_records(tmp_path: Path) -> None:
    path = tmp_path / "b" / "data.json"
    b = DatasetBudget.open(path, H)
    p = plan(max_batch_size=40)
    b.record_run("r1", p)
    b.record_run("r1", p)  # a resume: the same run, once
    for t in (4, 0, 4, 2):  # write-ahead per vector: a round once, however often
        b.record_submission("r1", t)
    b.record_ledger("r1", 5)  # a verified ledger held 5 releases at those rounds (re-runs)
    b.record_ledger("r1", 2)  # the most seen is kept
    assert b.rounds_submitted("r1") == [0, 2, 4]
    data = json.loads(path.read_text())
    assert data["format"] == 1 and data["dataset_sha256"] == H
    entry = data["runs"]["r1"]
    assert entry["rounds_submitted"] == [0, 2, 4] and entry["ledger_releases"] == 5
    assert entry["plan"]["sampling"] == POISSON and entry["plan"]["num_parameters"] == 62
    assert path.stat().st_mode & 0o777 == 0o600
    # Reopened (another process): the same figures. Steps = the most of the records.
    run = DatasetBudget.open(path, H).run("r1")
    assert run is not None and run.steps == 5
    assert run.epsilon == pytest.approx(eps(p, 5), rel=1e-12)
    # The one delta formula: d noise samples per step, and the capped-Poisson term per step.
    assert run.delta == reported_delta(1e-5, run.epsilon, 5 * 62, 5)
    summary = budget_summary(path)
    assert summary["dataset_sha256"] == H and summary["budget_file"] == str(path)
    (r1,) = summary["runs"]
    assert (r1["run_id"], r1["steps"], r1["rounds_submitted"], r1["ledger_releases"]) == (
        "r1", 5, 3, 5,
    )  # fmt: skip
    assert r1["epsilon"] == run.epsilon and r1["delta"] == run.delta
    life = summary["lifetime"]
    assert (life["epsilon"], life["delta"], life["method"]) == (
        run.epsilon,
        run.delta,
        "sequential",
    )
    json.dumps(summary, allow_nan=False)  # JSON as it stands
    text = format_budget(summary)
    assert f"budget file {path}" in text and f"data set sha256 {H}" in text
    assert "run r1 (spgc, noise multiplier 1, Poisson rate 0.1, rdp): 5 step(s)" in text
    assert f"lifetime over 1 run(s): epsilon {run.epsilon:.6g}" in text


def test_steps_count_local_vectors_reruns_and_fixed_batch_epochs(tmp_path: Path) -> None:
    b = DatasetBudget.open(tmp_path / "f.json", H)
    b.record_run("ldp", plan(mode="ldp"))
    b.record_submission("ldp", 0)
    assert b.record_local_vector("ldp") == 1 and b.record_local_vector("ldp") == 2
    assert b.run("ldp").steps == 2  # a second noisy vector for round 0: counted
    b.record_run("again", plan())
    b.record_submission("again", 3)
    b.record_submission("again", 3)  # both servers dropped it: a fresh vector
    assert b.run("again").steps == 2
    b.record_submission("again", 3, fresh=False)  # ldp: the same noisy vector sent again
    assert b.run("again").steps == 2
    fixed = {"sampling": "fixed", "sample_size": 10, "population": 40}  # 4 batches an epoch
    b.record_run("fixed", plan(sampling=fixed))
    b.record_submission("fixed", 5)  # one round, but release 5 is in the second epoch
    run = b.run("fixed")
    assert run.steps == 6 and run.epsilon == pytest.approx(eps(plan(sampling=fixed), 6))
    b.record_submission("fixed", 6, release_index=9)  # a re-run round moved the releases on
    assert b.run("fixed").steps == 10
    assert b.projected_steps("fixed", 7, fresh=True, release_index=12) == 13


def test_runs_compose_sequentially_or_by_rdp_whichever_is_smaller(tmp_path: Path) -> None:
    b = DatasetBudget.open(tmp_path / "c.json", H)
    a, c = (
        plan(),
        plan(noise_multiplier=1.5, sampling={"sampling": "poisson", "sampling_rate": 0.05}),
    )
    b.record_run("a", a)
    b.record_run("c", c)
    for t in range(20):
        b.record_submission("a", t)
    for t in range(30):
        b.record_submission("c", t)
    ea, ec = eps(a, 20), eps(c, 30)
    # RDP composition of both runs' steps, at the sum of their deltas (computed here anew).
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 20)
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.5)), 30)
    composed = acc.get_epsilon(2e-5)
    assert composed < ea + ec  # RDP composition is tighter here: reported, and named
    spent = b.spent()
    assert spent.method == "rdp" and spent.runs == 2
    assert spent.epsilon == pytest.approx(composed, rel=1e-9)
    assert spent.delta == reported_delta(2e-5, spent.epsilon, (20 + 30) * 62, 0)
    assert b.spent(exclude_run="c").epsilon == pytest.approx(ea)  # one run: its own figure
    # A run RDP composition does not cover (fixed batches): sequential, the sum.
    fixed = plan(sampling={"sampling": "fixed", "sample_size": 10, "population": 40})
    b.record_run("f", fixed)
    b.record_submission("f", 0)
    spent = b.spent()
    ef = eps(fixed, 1)
    assert spent.method == "sequential"
    assert spent.epsilon == pytest.approx(ea + ec + ef, rel=1e-12)
    runs = {r.run_id: r for r in b.runs()}
    assert spent.delta == pytest.approx(sum(r.delta for r in runs.values()), rel=1e-12)
    # A run that recorded nothing spent nothing and changes nothing.
    b.record_run("idle", plan(accountant="pld"))
    assert b.spent().epsilon == spent.epsilon and b.spent().runs == 3
    # A run without noise that used the data: no guarantee any more.
    b.record_run("plain", plan(mode="plain", noise_multiplier=0.0, delta=0.0, target_epsilon=None))
    b.record_submission("plain", 0)
    spent = b.spent()
    assert math.isinf(spent.epsilon) and spent.method == "no noise"
    summary = budget_summary(b.path)
    assert summary["lifetime"]["epsilon"] is None
    assert summary["lifetime"]["differentially_private"] is False
    plain = next(r for r in summary["runs"] if r["run_id"] == "plain")
    assert plain["epsilon"] is None and plain["differentially_private"] is False
    json.dumps(summary, allow_nan=False)
    text = format_budget(summary)
    assert "run plain (plain): 1 step(s)" in text and "NOT differentially private" in text
    assert "lifetime over 4 run(s): NOT differentially private" in text


def test_a_failed_write_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Atomic: the new contents go to a temporary file, fsynced, renamed over the file, and
    the directory fsynced; a failure before the rename leaves the old file whole."""
    path = tmp_path / "a.json"
    b = DatasetBudget.open(path, H)
    b.record_run("r", plan())
    before = path.read_bytes()
    events: list[str] = []
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + Path(f"/proc/self/fd/{fd}").readlink().name)
        real_fsync(fd)

    def replace(self: Path, target: Path) -> Path:
        events.append("rename")
        return real_replace(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", replace)
    b.record_submission("r", 0)
    assert events == [f"fsync .a.json.{os.getpid()}.tmp", "rename", f"fsync {tmp_path.name}"]

    def broken(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", broken)
    with pytest.raises(BudgetError, match=f"budget file {path}: cannot be written"):
        b.record_submission("r", 1)
    assert b.rounds_submitted("r") == [0]
    assert [p.name for p in tmp_path.iterdir() if p.name != "a.json.lock"] == ["a.json"]
    assert before != path.read_bytes()  # (round 0 is in it)


COUNT_VECTORS = """
import sys
from pathlib import Path
from spgc.privacy.budget import DatasetBudget
b = DatasetBudget.open(Path(sys.argv[1]), sys.argv[2])
for _ in range(int(sys.argv[3])):
    b.record_local_vector("r")
"""


def test_two_processes_holding_the_data_set_lose_no_update(tmp_path: Path) -> None:
    """Each update re-reads the file under the lock: three processes counting at once lose
    none of each other's counts."""
    path = tmp_path / "shared.json"
    DatasetBudget.open(path, H).record_run("r", plan(mode="ldp"))
    argv = [sys.executable, "-c", COUNT_VECTORS, str(path), H, "40"]
    procs = [subprocess.Popen(argv) for _ in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    assert DatasetBudget.open(path, H).run("r").local_vectors == 120


def test_bad_files_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(BudgetError, match=f"budget file {missing}: no such file"):
        budget_summary(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BudgetError, match=f"budget file {bad}: not JSON"):
        budget_summary(bad)
    bad.write_text(json.dumps({"format": 1, "dataset_sha256": H, "runs": {"r": {"plan": {}}}}))
    with pytest.raises(BudgetError, match=f"budget file {bad}: run 'r': mode is missing"):
        budget_summary(bad)
    other = tmp_path / "other.json"
    DatasetBudget.open(other, "cd" * 32)
    with pytest.raises(BudgetError, match=r"is of data set cdcd.*not of this one"):
        DatasetBudget.open(other, H)
    b = DatasetBudget.open(tmp_path / "p.json", H)
    b.record_run("r", plan())
    with pytest.raises(BudgetError, match=r"run 'r' is recorded with another plan \(noise_mult"):
        b.record_run("r", plan(noise_multiplier=2.0))
    with pytest.raises(BudgetError, match="is not a hex SHA-256"):
        DatasetBudget.open(tmp_path / "x.json", "xyz")


def test_where_the_file_lives_and_what_names_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 0, 1])
    h = dataset_sha256(x, y)
    assert h == dataset_sha256(x.copy(order="F"), y)  # C order, whatever the layout
    assert h != dataset_sha256(x, y[::-1])  # the values
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "spgc"
    assert budget_path(None, None, h) == tmp_path / "xdg" / "spgc" / "budget" / f"{h}.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "spgc"
    assert budget_path(tmp_path / "s", None, h) == tmp_path / "s" / "budget" / f"{h}.json"
    assert budget_path(tmp_path / "s", tmp_path / "f.json", h) == tmp_path / "f.json"
    # The provider's keys; relative paths in a file are the file's directory's.
    f = tmp_path / "conf" / "provider.yaml"
    f.parent.mkdir()
    f.write_text(
        "name: p1\nh1_address: '127.0.0.1:5001'\ninsecure: true\nallow_no_privacy: true\n"
        "state_dir: state\nbudget_file: budget.json\n"
    )
    cfg = load_provider_config(f)
    assert cfg.state_dir == tmp_path / "conf" / "state"
    assert cfg.budget_file == tmp_path / "conf" / "budget.json"


def test_a_data_set_is_its_rows_not_their_order_or_type() -> None:
    """Issue 45, hole 4. Before: shuffling the rows, storing float64 instead of float32 or
    int32 labels instead of int64 named another data set, with a fresh budget. The rows as a
    multiset (values and labels) name it now; a row more or less, or another value, does not."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(50, 4)).astype(np.float32)
    y = rng.integers(0, 3, 50)
    h = dataset_sha256(x, y)
    perm = rng.permutation(50)
    assert dataset_sha256(x[perm], y[perm]) == h  # the rows shuffled
    assert dataset_sha256(x.astype(np.float64), y.astype(np.int32)) == h  # other types
    assert dataset_sha256(x.reshape(50, 2, 2), y.reshape(50, 1)) == h  # each row's layout
    assert dataset_sha256(np.where(x == 0, -0.0, x), y) == h
    assert dataset_sha256(x[:-1], y[:-1]) != h  # a subset
    assert dataset_sha256(np.vstack([x, x[:1]]), np.append(y, y[0])) != h  # a row more
    changed = x.copy()
    changed[3, 1] += 1
    assert dataset_sha256(changed, y) != h  # another value
    assert dataset_sha256(x, (y + 1) % 3) != h  # other labels
    assert dataset_sha256(x[:, ::-1], y) != h  # the features in another order
    with pytest.raises(BudgetError, match="50 rows of x but 49 labels"):
        dataset_sha256(x, y[:-1])


def test_a_budget_file_named_the_old_way_is_taken_over(tmp_path: Path) -> None:
    """Files named by the old digest keep counting: a provider upgraded forgets no run."""
    x, y = np.ones((3, 2), dtype=np.float32), np.array([0, 1, 0])
    old, new = legacy_dataset_sha256(x, y), dataset_sha256(x, y)
    old_path = budget_path(tmp_path, None, old)
    DatasetBudget.open(old_path, old).record_run("r1", plan())
    budget = DatasetBudget.open(budget_path(tmp_path, None, new), new, (old_path, old))
    assert [r.run_id for r in budget.runs()] == ["r1"]
    configured = tmp_path / "mine.json"  # budget_file set: the same file, renamed inside
    DatasetBudget.open(configured, old).record_run("r2", plan())
    budget = DatasetBudget.open(configured, new, (configured, old))
    budget.record_submission("r2", 0)
    assert read_budget_file(configured)["dataset_sha256"] == new


def test_every_vector_that_left_is_counted_across_a_restart(tmp_path: Path) -> None:
    """Issue 45, hole 5. Before: a provider restarted and the servers ran that round again: 3
    vectors left it, its budget file recorded 2 steps (the re-run was told apart only in
    memory). A fresh vector for a round already recorded is a step more, whoever asks."""
    path = tmp_path / "b.json"
    DatasetBudget.open(path, H).record_run("r", plan())
    before = DatasetBudget.open(path, H)
    before.record_submission("r", 0)
    before.record_submission("r", 1)
    after = DatasetBudget.open(path, H)  # the provider restarted: nothing in memory
    after.record_submission("r", 1)  # round 1 again, with a fresh vector
    assert after.run("r").steps == 3


# ----------------------------------------------------------------------------- the provider


def test_the_lifetime_limit_holds_across_runs_of_the_servers(pki: Path, tmp_path: Path) -> None:
    """Two real server pairs, one after the other (the second a new run: a fresh state_dir,
    a new run id, its own fresh budget). The provider's data set spent epsilon in the first
    run; its max_total_epsilon bounds the data set's lifetime, so it declines the second
    run, naming the figures, and the servers hear why."""
    run = {"mode": "spgc", "rounds": 1, "min_providers": 1, "noise_multiplier": 1.0,
           "sampling_rate": 0.1, "target_epsilon": 5.0}  # fmt: skip
    for sub in ("first", "second"):
        (tmp_path / sub).mkdir()
    d1, d2 = start_pair(pki, tmp_path / "first", **run)
    try:
        cfg = daemon_provider_config(pki, d1, d2, 0, max_total_epsilon=6.0, connect_timeout=30)
        with ProviderClient(cfg) as client:
            reports = client.run()
        assert [r.round for r in reports] == [0] and reports[0].accepted
        first = d1.state.run_id
        x, y = client._x, client._y  # the provider's own rows (its part of cancer)
        assert x is not None and y is not None
    finally:
        d1.stop()
        d2.stop()
    (path,) = (Path(os.environ["XDG_STATE_HOME"]) / "spgc" / "budget").glob("*.json")
    summary = budget_summary(path)
    (r1,) = summary["runs"]
    spent = eps(plan(), 1)  # one release: noise multiplier 1, rate 0.1 (2.13)
    assert (r1["run_id"], r1["steps"]) == (first, 1)
    assert r1["epsilon"] == pytest.approx(spent, rel=1e-9)

    d1, d2 = start_pair(pki, tmp_path / "second", **run)
    try:
        cfg = daemon_provider_config(pki, d1, d2, 0, max_total_epsilon=6.0, connect_timeout=30)
        # The same rows shuffled (issue 45, hole 4): the same data set, the same budget file.
        shuffled = np.random.default_rng(3).permutation(len(x))
        data = (x[shuffled], y[shuffled])
        with ProviderClient(cfg, data=data) as client, pytest.raises(ProviderRefusal) as refused:
            client.connect()
        said, second = str(refused.value), d1.state.run_id
        assert second != first
        assert f"this data set (budget file {path}) has spent epsilon {spent:.4g}" in said
        assert f"over 1 earlier run(s); run {second} may spend up to 5 more" in said
        assert f"{spent + 5:.4g} > max_total_epsilon 6" in said
        for daemon in (d1, d2):
            assert "max_total_epsilon 6" in daemon.state.summary()["declined"]["p1"]
    finally:
        d1.stop()
        d2.stop()
    assert [r["run_id"] for r in budget_summary(path)["runs"]] == [first]  # not joined


def fake_pair(pki: Path, config: Any) -> list[FakeServer]:
    return [
        FakeServer(pki / "good", FakeAggregator(pb.SERVER_ROLE_H1, "h1", config, FAKE_MODEL)),
        FakeServer(pki / "good", FakeAggregator(pb.SERVER_ROLE_H2, "h2", config, FAKE_MODEL)),
    ]


def fake_single(pki: Path, config: Any) -> FakeServer:
    return FakeServer(pki / "good", FakeAggregator(pb.SERVER_ROLE_SINGLE, "h1", config, FAKE_MODEL))


@pytest.fixture(scope="module")
def cancer() -> tuple[np.ndarray, np.ndarray]:
    ds = load_dataset("cancer")
    return ds.x_train, ds.y_train


def test_a_resume_is_not_counted_twice_and_concurrent_runs_share_the_limit(
    pki: Path, cancer: Any
) -> None:
    """Run a is joined again (a resume): its own steps are not counted against it twice.
    Runs a and b of the same data joined while nothing was spent; once a spent, b's first
    vector would pass the lifetime limit: b leaves before sending it."""
    one = eps(plan(), 1)  # noise multiplier 1, q 0.1: 2.13 a step
    started = []
    try:
        pa = fake_pair(pki, training_config(run_id="run-a", target_epsilon=3.0))
        pb_ = fake_pair(pki, training_config(run_id="run-b", target_epsilon=3.0))
        started = pa + pb_
        cfg_a = provider_config(pki / "good", pa, max_total_epsilon=4.0)
        cfg_b = provider_config(pki / "good", pb_, max_total_epsilon=4.0)
        with ProviderClient(cfg_a, data=cancer) as a, ProviderClient(cfg_b, data=cancer) as b:
            a.connect()
            b.connect()  # nothing spent yet: 0 + 3 <= 4
            assert a.run_round() is not None
            a.connect()  # a resume of run a: 2.13 of its own, not counted as an earlier run
            with pytest.raises(ProviderRefusal) as refused:
                b.run_round()
        said = str(refused.value)
        assert f"has spent epsilon {one:.4g}" in said and "over 1 earlier run(s)" in said
        assert "> this provider's max_total_epsilon 4" in said
        assert not pb_[0].servicer.attempts and not pb_[1].servicer.attempts
    finally:
        for s in started:
            s.stop()
    # The check before a vector leaves holds the lifetime too (here alone, as if the ledger
    # check had passed), and records the round only when it lets the vector go.
    budget = DatasetBudget.open(a.budget.path, a.budget.budget.dataset_sha256)
    guard = ProviderBudget(budget, cfg_b, "run-b", b.budget.plan)
    with pytest.raises(ProviderRefusal, match=r"round 3: this data set .* 1 step\(s\) of run"):
        guard.before_submit(3, fresh=True, release_index=None)
    assert budget.rounds_submitted("run-b") == []
    guard.cfg = cfg_b.model_copy(update={"max_total_epsilon": 5.0})
    guard.before_submit(3, fresh=True, release_index=None)
    assert budget.rounds_submitted("run-b") == [3]


def ldp_config(**changes: Any) -> Any:
    base = training_config()
    std = 3.0 * base.l2_bound_units
    return training_config(mode=pb.MODE_LDP, noise_multiplier=3.0, noise_std_units=std, **changes)


def ldp_client(pki: Path, server: FakeServer, data: Any, **cfg: Any) -> ProviderClient:
    return ProviderClient(provider_config(pki / "good", [server], **cfg), data=data)


def test_ldp_a_round_sent_again_gets_the_same_noisy_vector(pki: Path, cancer: Any) -> None:
    """A failed upload is retried with the same vector, and a round the server drops and runs
    again gets the same vector too: one noisy vector drawn, counted once. After a restart
    (the vector is lost) a second one is drawn, and counted."""
    server = fake_single(pki, ldp_config())
    try:
        server.servicer.fail_before_accept = 1  # the first upload fails
        with ldp_client(pki, server, cancer) as client:
            assert client.run_round().accepted
            server.servicer.accepted.clear()  # the server dropped the round, runs it again
            again = client.run_round()
            assert again is not None and again.round == 3 and again.accepted
            path = client.budget.path
        sent = [vec for _, vec in server.servicer.attempts]
        assert len(sent) == 3 and all(np.array_equal(v, sent[0]) for v in sent)
        (run,) = budget_summary(path)["runs"]
        assert (run["local_vectors"], run["rounds_submitted"], run["steps"]) == (1, 1, 1)
        server.servicer.accepted.clear()
        with ldp_client(pki, server, cancer) as restarted:  # a new process: nothing kept
            assert restarted.run_round().accepted
        assert not np.array_equal(server.servicer.attempts[-1][1], sent[0])
        (run,) = budget_summary(path)["runs"]
        assert (run["local_vectors"], run["rounds_submitted"], run["steps"]) == (2, 1, 2)
    finally:
        server.stop()


def test_ldp_the_provider_stops_at_its_own_count(pki: Path, cancer: Any) -> None:
    """The plan's budget fits one noisy vector, not two: after a restart the provider does
    not draw a second one for the run (whatever the server counts), and sends nothing."""
    p = plan(noise_multiplier=3.0)
    target = (eps(p, 1) + eps(p, 2)) / 2
    server = fake_single(pki, ldp_config(target_epsilon=target))
    try:
        with ldp_client(pki, server, cancer) as client:
            assert client.run_round().accepted
        server.servicer.accepted.clear()
        with ldp_client(pki, server, cancer) as restarted, pytest.raises(ProviderRefusal) as no:
            restarted.run_round()
        assert "has drawn 1 noisy vector(s) for run run-provider-test" in str(no.value)
        assert f"one more would spend epsilon {eps(p, 2):.4g} > the plan's target" in str(no.value)
        assert len(server.servicer.attempts) == 1
        # The lifetime limit holds for ldp draws too.
        server.servicer.accepted.clear()
        other = fake_single(pki, ldp_config(run_id="run-2", target_epsilon=target))
        try:
            limit = target * 1.01  # the plan alone fits; with the earlier run it does not
            declined = pytest.raises(ProviderRefusal, match=r"over 1 earlier run\(s\); run run-2")
            with ldp_client(pki, other, cancer, max_total_epsilon=limit) as c, declined:
                c.run_round()  # declined at once: 1 earlier run + this run's budget
            assert not other.servicer.attempts
        finally:
            other.stop()
    finally:
        server.stop()


def test_spgc_account_budget_prints_the_file(tmp_path: Path) -> None:
    """`spgc account --budget FILE`: the file's runs and lifetime figure; one line and exit 2
    for a file that cannot be read."""
    path = tmp_path / "data.json"
    b = DatasetBudget.open(path, H)
    b.record_run("r1", plan())
    b.record_submission("r1", 0)
    spgc = [sys.executable, "-m", "spgc.app.cli"]
    done = subprocess.run([*spgc, "account", "--budget", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["dataset_sha256"] == H and [r["run_id"] for r in got["runs"]] == ["r1"]
    # (in this process: the real command ran above)
    done = run_in_process("account", "--budget", str(path))
    assert done.returncode == 0 and f"budget file {path}" in done.stdout
    missing = run_in_process("account", "--budget", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("spgc account: error: ")


def test_a_run_with_the_feature_statistics_counts_their_release_first(tmp_path: Path) -> None:
    """standardize (issue 48 part 2): the run's first release is the statistics' (unsampled,
    its own noise multiplier), alone and in the RDP composition with another run; a plan
    without them is stored as before."""
    b = DatasetBudget.open(tmp_path / "s.json", H)
    with_stats, other = plan(stats_noise_multiplier=6.0), plan(noise_multiplier=1.5)
    b.record_run("s", with_stats)
    b.record_run("o", other)
    for t in range(11):  # round 0 the statistics, then 10 steps
        b.record_submission("s", t)
    for t in range(10):
        b.record_submission("o", t)
    alone = PrivacyAccountant(1.0, 1e-5, **POISSON, unsampled=[6.0]).epsilon_after(10)
    assert b.spent(exclude_run="o").epsilon == pytest.approx(alone, rel=1e-9)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(6.0))
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 10)
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.5)), 10)
    spent = b.spent()
    assert spent.method == "rdp"
    assert spent.epsilon == pytest.approx(acc.get_epsilon(2e-5), rel=1e-9)
    stored = json.loads((tmp_path / "s.json").read_text())["runs"]
    assert stored["s"]["plan"]["stats_noise_multiplier"] == 6.0
    assert "stats_noise_multiplier" not in stored["o"]["plan"]
