"""Worker pairs on Ray (servers.ray_workers): a round's circuit over K worker pairs on a local
Ray cluster gives the same vector as the embedded path; a lost worker fails the round."""

from __future__ import annotations

import hashlib
import socket
import time
from typing import ClassVar

import numpy as np
import pytest
from helpers import Background, wait_until

from spgc.privacy.noise import SPARE_GROUP, SPARES_EVERY, sample_noise_plain
from spgc.servers.gc_party import run_aggregate
from spgc.servers.noise_pool import produce_noise_shares

ray = pytest.importorskip("ray", reason="the Ray extra (pip install '.[ray]') is missing")

from spgc.servers import ray_workers  # noqa: E402
from spgc.servers.ray_workers import (  # noqa: E402
    WorkerLost,
    WorkerTls,
    check_ray_address,
    connect_workers,
    init_ray,
    start_workers,
)

RING = 16
# One local Ray cluster at a time: under pytest-xdist every test here runs on the same worker.
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def cluster():
    init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


NODE_TIMEOUT = "The current node timed out during startup. This could happen ..."
GCS_TIMEOUT = "Timed out waiting for file /tmp/ray/session_x/gcs_server_port_0123abcd"


class FakeNode:
    """Stands for ray._private.node.Node: its constructor starts processes, then may time out
    waiting for them, as Ray's does on a busy machine."""

    killed: ClassVar[list[FakeNode]] = []

    def __init__(self, times_out: bool, words: str = NODE_TIMEOUT) -> None:
        if times_out:
            raise Exception(words)

    def kill_all_processes(self, check_alive: bool = True, allow_graceful: bool = False) -> None:
        FakeNode.killed.append(self)


FakeNode.__name__ = "Node"


class FakeRay:
    """ray.init that fails the first ``failures`` times with ``error`` (None: the node's
    start-up timeout, raised from inside the node's constructor as Ray does)."""

    def __init__(
        self, failures: int, error: Exception | None = None, words: str = NODE_TIMEOUT
    ) -> None:
        self.failures = failures
        self.error = error
        self.words = words
        self.inits: list[dict] = []
        self.shutdowns = 0

    def init(self, **kwargs: object) -> None:
        self.inits.append(kwargs)
        if len(self.inits) <= self.failures:
            if self.error is not None:
                raise self.error
            FakeNode(times_out=True, words=self.words)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake_ray(monkeypatch):
    def install(
        failures: int, error: Exception | None = None, words: str = NODE_TIMEOUT
    ) -> FakeRay:
        fake = FakeRay(failures, error, words)
        monkeypatch.setattr(ray_workers, "_ray", lambda: fake)
        FakeNode.killed.clear()
        return fake

    return install


@pytest.mark.parametrize("words", [NODE_TIMEOUT, GCS_TIMEOUT], ids=["node", "gcs-port-file"])
def test_a_local_node_that_misses_rays_start_up_wait_is_started_again(fake_ray, caplog, words):
    fake = fake_ray(failures=2, words=words)
    with caplog.at_level("WARNING", logger="spgc.servers.ray_workers"):
        init_ray(num_cpus=2)
    assert len(fake.inits) == 3 and fake.shutdowns == 2
    assert len(FakeNode.killed) == 2  # each half-started node's processes were stopped
    assert [r.getMessage() for r in caplog.records] == [
        "Ray's local node did not start within Ray's 30 s (attempt 1 of 3; a busy machine?): "
        "starting it again",
        "Ray's local node did not start within Ray's 30 s (attempt 2 of 3; a busy machine?): "
        "starting it again",
    ]


def test_a_local_node_that_never_starts_fails_after_the_last_attempt(fake_ray):
    fake = fake_ray(failures=5)
    with pytest.raises(Exception, match="timed out during startup"):
        init_ray(attempts=3, address="local")
    assert len(fake.inits) == 3


@pytest.mark.parametrize(
    ("address", "error"),
    [
        ("ray://10.0.0.7:10001", None),  # a named cluster: its operator's to fix, not ours
        ("", ConnectionError("no GCS")),  # any other failure
    ],
)
def test_other_start_failures_are_raised_at_once(fake_ray, address, error):
    fake = fake_ray(failures=5, error=error)
    with pytest.raises(Exception):  # noqa: B017  (Ray raises a bare Exception on the timeout)
        init_ray(address=address)
    assert len(fake.inits) == 1 and fake.shutdowns == 0


def kill_and_wait_until_gone(actor: object, timeout: float = 60.0) -> None:
    """ray.kill, then wait until the actor answers no more (ray.kill only asks for it): what
    runs on it next fails for sure, however quick or slow this machine is."""
    ray.kill(actor)

    def gone() -> bool:
        try:
            ray.get(actor.peak_rss_mb.remote(), timeout=5)  # type: ignore[attr-defined]
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            pass
        return False

    wait_until(gone, "the killed Ray worker to be gone", timeout=timeout)


def pairs(k: int, backend: str = "gc", trial_depth: int | None = None) -> tuple[list, list, list]:
    kw = {"backend": backend, "trial_depth": trial_depth}
    g = start_workers("garbler", k, WorkerTls(insecure=True), **kw)
    e = start_workers("evaluator", k, WorkerTls(insecure=True), **kw)
    lanes_g, lanes_e = connect_workers(g, e, "127.0.0.1", backend=backend)
    return lanes_g, lanes_e, g + e


def shares(n: int, seed: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sums = [int(x) for x in rng.integers(-3000, 3000, n)]
    r = rng.integers(0, 1 << RING, n, dtype=np.uint64)
    a1 = np.array([(s + int(q)) % (1 << RING) for s, q in zip(sums, r, strict=True)], np.uint64)
    return sums, a1, r


@pytest.mark.parametrize("k", [1, 2, 3])
def test_worker_pairs_release_the_sums_plus_the_seeds_noise(cluster, k):
    sums, a1, a2 = shares(400, 1)
    s1 = hashlib.sha256(b"ray-1-%d" % k).digest()
    s2 = hashlib.sha256(b"ray-2-%d" % k).digest()
    lanes_g, lanes_e, actors = pairs(k)
    try:
        side = Background(lambda: run_aggregate("garbler", lanes_g, a1, s1, 500.0, RING, "spgc"))
        ye, ie = run_aggregate("evaluator", lanes_e, a2, s2, 500.0, RING, "spgc")
        yg, ig = side.result()
    finally:
        for a in actors:
            ray.kill(a)
    assert yg.tolist() == ye.tolist()
    # the whole batch's plaintext noise for these seeds: the same for any number of pairs
    z = sample_noise_plain(s1, s2, len(sums), 500.0)
    assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
    assert ig["lanes"] == ie["lanes"] == k
    assert ig["phases"]["tables"]["sent"] == ie["phases"]["tables"]["received"] > 0


def _gmw_round_on_two_pairs(trial_depth: int | None) -> dict:
    """backend gmw on two worker pairs: GMW sessions on the workers' links; the split falls on
    a spare group's boundary (SPARE_GROUP), so the release is the whole batch's plaintext
    reference with gmw's spare trials, and each pair ran its part. H1's round info."""
    n = SPARE_GROUP + 300
    sums, a1, a2 = shares(n, 2)
    tag = b"" if trial_depth is None else b"-%d" % trial_depth  # a seed is never used twice
    s1 = hashlib.sha256(b"ray-gmw-1" + tag).digest()
    s2 = hashlib.sha256(b"ray-gmw-2" + tag).digest()
    lanes_g, lanes_e, actors = pairs(2, "gmw", trial_depth)
    try:
        side = Background(lambda: run_aggregate("garbler", lanes_g, a1, s1, 500.0, RING, "spgc"))
        ye, ie = run_aggregate("evaluator", lanes_e, a2, s2, 500.0, RING, "spgc")
        yg, ig = side.result()
        per_lane = [lane.counters()["tables"]["sent"] for lane in lanes_g]
    finally:
        for a in actors:
            ray.kill(a)
    assert yg.tolist() == ye.tolist()
    z = sample_noise_plain(s1, s2, n, 500.0, spares_every=SPARES_EVERY["gmw"])
    assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
    assert ig["lanes"] == ie["lanes"] == 2 and all(t > 0 for t in per_lane)
    # GMW's online openings: under a byte per AND gate, far below garbling's 24.6
    assert ig["phases"]["tables"]["sent"] < ig["and_gates"] / 2
    return ig


def test_gmw_worker_pairs_release_the_same_round(cluster):
    _gmw_round_on_two_pairs(None)


def test_gmw_worker_pairs_run_the_plans_trial_depth(cluster):
    """The plan's trial_depth reaches the workers' sessions (servers/worker_pairing passes it):
    at depth 48 the same release takes fewer AND gates than at 28, the default."""
    deep, default = _gmw_round_on_two_pairs(48), _gmw_round_on_two_pairs(28)
    assert deep["and_gates"] < 0.8 * default["and_gates"]


@pytest.mark.parametrize("k", [1, 2])
def test_worker_pairs_make_the_same_noise_block(cluster, k):
    """Preprocessed mode's noise block on K worker pairs: the shares add up to the plaintext
    noise of the two seeds, whatever K; each worker reports its bytes and peak RSS."""
    n, ring = 500, 32
    s1 = hashlib.sha256(b"ray-pool-1-%d" % k).digest()
    s2 = hashlib.sha256(b"ray-pool-2-%d" % k).digest()
    lanes_g, lanes_e, actors = pairs(k)
    try:
        side = Background(lambda: produce_noise_shares("garbler", lanes_g, n, 400.0, ring, s1))
        u, ie = produce_noise_shares("evaluator", lanes_e, n, 400.0, ring, s2)
        neg_r, ig = side.result()
        worker_tables = [lane.counters()["tables"]["sent"] for lane in lanes_g]
    finally:
        for a in actors:
            ray.kill(a)
    total = (neg_r.astype(object) + u.astype(object)) & ((1 << ring) - 1)
    signed = [v - (1 << ring) if v >= 1 << (ring - 1) else v for v in total.tolist()]
    assert signed == sample_noise_plain(s1, s2, n, 400.0).tolist()
    assert ig["lanes"] == ie["lanes"] == k
    assert all(t > 0 for t in worker_tables)
    assert sum(worker_tables) == ig["phases"]["tables"]["sent"]


def test_a_lost_worker_fails_the_round_on_both_servers(cluster):
    _, a1, a2 = shares(30000, 2)
    lanes_g, lanes_e, actors = pairs(2)
    s1, s2 = hashlib.sha256(b"ray-kill-1").digest(), hashlib.sha256(b"ray-kill-2").digest()
    # The garbler's worker 1 dies inside the round, as the round hands it its range of
    # coordinates, and is gone before it gets it (deterministic: no timer racing a round
    # that may finish first, nor a kill that may land after the range is done).
    lost = lanes_g[1]
    assert lost.actor is actors[1]
    handed_out = lost.aggregate_range

    def dies_inside_the_round(**kwargs):  # type: ignore[no-untyped-def]
        kill_and_wait_until_gone(lost.actor)
        return handed_out(**kwargs)

    lost.aggregate_range = dies_inside_the_round
    side = Background(lambda: run_aggregate("garbler", lanes_g, a1, s1, 500.0, RING, "spgc"))
    try:
        with pytest.raises(Exception):  # noqa: B017 - the peer's failure surfaces as its own error
            run_aggregate("evaluator", lanes_e, a2, s2, 500.0, RING, "spgc")
        with pytest.raises(WorkerLost, match=r"circuit worker was lost mid-round \(\w+\)$"):
            side.result()  # one line, no Ray internals
    finally:
        for a in actors:
            ray.kill(a)


def test_servers_run_a_round_on_two_worker_pairs(cluster, tmp_path):
    """workers: 2 on both servers (one local Ray cluster stands in for both organisations'):
    the daemons pair their workers (PairWorkers on the control channel), the round's circuit
    runs on them, and both release the same noisy sum."""
    from test_server_daemon import PROVIDERS, Provider, start_pair, wait_round_done

    from spgc.protocol.certs import make_dev_pki
    from spgc.wire.errors import FailedPreconditionError

    pki = tmp_path / "pki"
    make_dev_pki(pki / "good", ["h1", "h2", *PROVIDERS])
    d1, d2 = start_pair(pki, tmp_path, mode="spgc", rounds=1, target_epsilon=8.0, workers=2)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        vecs = [np.full(cfg.num_parameters, 40 * (i + 1), dtype=np.int64) for i in range(3)]
        for p, v in zip(providers, vecs, strict=True):
            p.submit_both(cfg, 0, v)
        wait_round_done((d1, d2), 0, timeout=60)
        r1, r2 = d1.state.history[0], d2.state.history[0]
        assert r1.model_sha256 == r2.model_sha256
        np.testing.assert_array_equal(
            np.asarray(r1.noisy_sum_units, dtype=np.int64),
            np.asarray(r2.noisy_sum_units, dtype=np.int64),
        )
        assert len(d1._workers) == len(d2._workers) == 2
        with pytest.raises(FailedPreconditionError, match="already linked"):  # once a pairing
            d2.peer_servicer.link_workers([("127.0.0.1", 1), ("127.0.0.1", 2)], 2, 1.0)
        # the circuit ran on the workers: the daemons' own data link carried no tables
        assert d1._gc_channels[0].counters()["tables"]["sent"] == 0
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_precompute_fills_the_pool_on_two_worker_pairs(cluster, tmp_path):
    """`spgc server precompute` with workers: 2: the noise blocks are made on the worker pairs
    (the daemons' own data link carries no tables) and both pools hold the same blocks."""
    from test_server_daemon import PROVIDERS, bind_pair

    from spgc.protocol.certs import make_dev_pki

    pki = tmp_path / "pki"
    make_dev_pki(pki / "good", ["h1", "h2", *PROVIDERS])
    kw = {"mode": "preprocessed", "rounds": 1, "noise_multiplier": 1.0, "pool_block": 40}
    a, b = bind_pair(pki, tmp_path, precompute=90, workers=2, **kw)
    try:
        b.start()
        a.start()
        assert a.wait(120) and b.wait(120) and a.error is None and b.error is None
        assert a.state.pool.available == b.state.pool.available == 90
        assert [blk.count for blk in a.state.pool.blocks] == [40, 40, 10]
        assert [blk.block_id for blk in a.state.pool.blocks] == [
            blk.block_id for blk in b.state.pool.blocks
        ]
        assert a._gc_channels[0].counters()["tables"]["sent"] == 0
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("side", [1, 2])
def test_a_lost_worker_fails_the_round_which_is_counted_and_run_again(cluster, tmp_path, side):
    """One of H1's or H2's workers dies before round 0's circuit: the round fails on both
    servers after its release was written ahead, both go back to their checkpoint, pair fresh
    workers, and run round 0 again as a new release with fresh seeds; both ledgers count
    both releases (H1's lost worker once stopped the whole run)."""
    from test_server_daemon import PROVIDERS, Provider, start_pair, wait_round_done

    from spgc.privacy.ledger_verify import verify_ledger
    from spgc.protocol.certs import make_dev_pki

    pki = tmp_path / "pki"
    make_dev_pki(pki / "good", ["h1", "h2", *PROVIDERS])
    d1, d2 = start_pair(
        pki, tmp_path, mode="spgc", rounds=1, noise_multiplier=2.0, target_epsilon=50.0,
        workers=2,
    )  # fmt: skip
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        losing = d1 if side == 1 else d2
        first_workers = list(losing._workers)
        kill_and_wait_until_gone(first_workers[1])  # gone before the round's circuit starts
        vec = np.full(cfg.num_parameters, 40, dtype=np.int64)
        for p in providers:
            p.submit_both(cfg, 0, vec)
        # the round fails, both servers rejoin and round 0 opens again: submit once more
        cfg = providers[0].wait_collecting(0, timeout=90)
        assert losing._workers and losing._workers[1] is not first_workers[1]
        for p in providers:
            p.submit_both(cfg, 0, vec)
        wait_round_done((d1, d2), 0, timeout=90)
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    for daemon, sub in ((d1, "s1"), (d2, "s2")):
        assert daemon.state.steps == 1
        report = verify_ledger(tmp_path / sub / "ledger.jsonl")
        assert report.steps == 2 == daemon.state.releases  # the failed release counts too


def test_h2_workers_that_cannot_reach_h1s_fail_the_pairing_on_both_sides(cluster, tmp_path):
    """PairWorkers names addresses where nothing listens: H2's workers cannot connect, the call
    is refused with FAILED_PRECONDITION naming the addresses (retrying would not help), and
    H2's own side of the pairing stops with the same words."""
    from test_server_daemon import PROVIDERS, bind_pair

    from spgc.protocol.certs import make_dev_pki
    from spgc.servers.state import PeerMismatchError
    from spgc.wire.errors import FailedPreconditionError

    pki = tmp_path / "pki"
    make_dev_pki(pki / "good", ["h1", "h2", *PROVIDERS])
    d1, d2 = bind_pair(pki, tmp_path, mode="spgc", workers=2)
    closed = []
    for _ in range(2):  # two ports that were free a moment ago
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed.append(("127.0.0.1", s.getsockname()[1]))
    try:
        with d2._workers_lock:
            d2._workers_generation += 1
            generation = d2._workers_generation
            d2._workers = start_workers("evaluator", 2, WorkerTls(insecure=True))
            d2._workers_started.set()
        d2.peer_servicer.paired = True
        with pytest.raises(FailedPreconditionError, match="could not connect to h1's at") as info:
            d2.peer_servicer.link_workers(closed, 2, 5.0)
        assert f"127.0.0.1:{closed[1][1]}" in info.value.message
        with pytest.raises(PeerMismatchError, match="could not connect"):
            d2._wait_for_worker_links(generation, 5.0)
        # a second call for the same pairing is refused: the workers are never handed twice
        with pytest.raises(FailedPreconditionError, match="already linked"):
            d2.peer_servicer.link_workers(closed, 2, 5.0)
    finally:
        d1.stop()
        d2.stop()


def test_a_named_cluster_nothing_answers_on_is_refused_at_once_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ray.init would wait minutes on it with only Ray's own lines.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        started = time.monotonic()
        with pytest.raises(
            ConnectionError, match=f"no Ray cluster answers at ray_address {address}"
        ):
            check_ray_address(address, timeout=5)
        assert time.monotonic() - started < 5
    # start_workers checks before it starts Ray (this module's cluster may be up: say it is not)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **_: pytest.fail("ray.init was called"))
    with pytest.raises(ConnectionError, match="no Ray cluster answers"):
        start_workers("garbler", 2, WorkerTls(insecure=True), ray_address=f"127.0.0.1:{port}")
    with socket.create_server(("127.0.0.1", 0)) as listening:
        check_ray_address(f"127.0.0.1:{listening.getsockname()[1]}", timeout=5)
    for resolved_by_ray in ("", "local", "auto"):
        check_ray_address(resolved_by_ray, timeout=0.001)
