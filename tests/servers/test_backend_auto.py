"""backend: auto between two real daemons on localhost: H1 measures the link at pairing, both
servers fix the same backend, the ledgers' headers and the summary name it; H2 refuses a
choice its figures do not give."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_server_daemon import (
    PROVIDERS,
    Provider,
    _cfg,
    bind_pair,
    pki,
    start_pair,
    wait_round_done,
)

from spgc.privacy.ledger_format import LEDGER_FILE
from spgc.protocol.modes import BACKEND_NAMES
from spgc.servers.daemon import ServerDaemon
from spgc.servers.pool_sync import RunSizer
from spgc.settings.backend_choice import (
    AUTO,
    LinkFigures,
    candidate_label,
    candidates,
    choose_backend,
)
from spgc.wire import PEER_PROTOCOL_VERSION, peer_pb2
from spgc.wire.errors import FailedPreconditionError

__all__ = ["pki"]  # the module-scoped PKI fixture of test_server_daemon


def _ledger_backend(daemon) -> str:
    first = (daemon.cfg.state_dir / LEDGER_FILE).read_text().splitlines()[0]
    header = json.loads(first)
    return header.get("backend", header.get("header", {}).get("backend"))


_AUTO_RUN = {"mode": "spgc", "rounds": 1, "target_epsilon": 8.0, "backend": AUTO}


@pytest.mark.parametrize("security", ["semi-honest", "malicious"])
def test_auto_picks_a_backend_both_servers_and_ledgers_name(pki, tmp_path, caplog, security):
    """Under malicious the same, on the authenticated engines' costs (H2 checks the choice
    from the figures with those too)."""
    caplog.set_level("INFO")
    run = {**_AUTO_RUN, "security": security}
    d1, d2 = start_pair(pki, tmp_path, **run)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        chosen = d1.cfg.backend
        assert chosen in BACKEND_NAMES and d2.cfg.backend == chosen
        assert cfg.backend == chosen  # the plan providers see names it
        depth = d1.cfg.trial_depth  # gmw: the trial depth chosen with it (gc: none)
        assert d2.cfg.trial_depth == depth and (cfg.trial_depth or None) == depth
        vecs = [np.full(cfg.num_parameters, 10 * (i + 1), dtype=np.int64) for i in range(3)]
        for p, v in zip(providers, vecs, strict=True):
            p.submit_both(cfg, 0, v)
        wait_round_done((d1, d2), 0, timeout=60)
        assert d1.wait(30) and d2.wait(30)
        assert d1.error is None and d2.error is None
        for dm in (d1, d2):
            assert _ledger_backend(dm) == chosen
        s1, s2 = d1.state.summary(), d2.state.summary()
        assert s1["backend"] == s2["backend"] == chosen
        figures = s1["backend_choice"]
        assert figures == s2["backend_choice"]  # H2 took the same figures through the same model
        link = LinkFigures(figures["rtt_ms"] / 1000, figures["mbit_per_s"] * 1e6 / 8)
        again = choose_backend(AUTO, "spgc", d1.plan.share_dim, link, security)
        assert (again.backend, again.trial_depth) == (chosen, depth)
        assert s1["security"] == s2["security"] == security
        labels = {candidate_label(c) for c in candidates("spgc", security)}
        assert set(figures["expected_round_seconds"]) == labels
        lines = [r.getMessage() for r in caplog.records if "backend auto" in r.getMessage()]
        level = "" if security == "semi-honest" else f" (security {security})"
        opening = f"h1: backend auto{level}: round trip"
        assert any(line.startswith(opening) for line in lines), lines
        assert figures["costs_of"] == security
        assert any(f"chose {again.label}" in line for line in lines)
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    # A restart with backend auto continues the run on the backend it was fixed with.
    for role in (1, 2):
        again = ServerDaemon(_cfg(pki, role, tmp_path / f"s{role}", **run))
        assert again.cfg.backend == chosen and again.state.config is None
        assert again.cfg.trial_depth == depth
        assert again.state.summary()["backend_choice"]["reason"] == "the run's, from its checkpoint"


def test_h2_refuses_a_backend_that_h1s_figures_do_not_give(pki, tmp_path):
    d1, d2 = bind_pair(pki, tmp_path, mode="spgc", rounds=1, target_epsilon=8.0, backend=AUTO)
    honest = d1._choose_backend

    def tampered(call, deadline):
        honest(call, deadline)  # measured and chosen as it should be, then swapped
        d1.cfg.backend = next(b for b in BACKEND_NAMES if b != d1.cfg.backend)

    d1._choose_backend = tampered
    d2.start()
    d1.start()
    try:
        assert d1.wait(40)
        assert "refusing the plan" in str(d1.error)
        assert "but its figures (round trip" in str(d1.error)
        assert not d2.peer_servicer.paired
    finally:
        d1.stop()
        d2.stop()


def test_auto_against_an_explicit_backend_is_a_plan_difference(pki, tmp_path):
    d1, d2 = bind_pair(pki, tmp_path, mode="spgc", rounds=1, target_epsilon=8.0, backend=AUTO)
    d2.cfg.backend = d2._requested_backend = "gc"
    d2.start()
    d1.start()
    try:
        assert d1.wait(40)
        assert "backend (h1 'auto', h2 'gc')" in str(d1.error)
        assert d1._backend_choice is None  # nothing measured against a fixed backend
    finally:
        d1.stop()
        d2.stop()


@pytest.mark.parametrize("security", ["semi-honest", "malicious"])
def test_production_runs_are_sized_from_the_link_until_one_is_measured(security):
    """Mode preprocessed: before any run, H1's RunSizer sizes runs as backend auto's model
    does for the measured link and security (pool_block caps them); a measured run then
    takes over."""
    link = LinkFigures(rtt_seconds=0.05, bytes_per_second=100e6 / 8)
    d = 28_938  # runs of fewer than MAX_RUN_ROUNDS rounds' noise: the model's cap is not hit
    choice = choose_backend(AUTO, "preprocessed", d, link, security)
    assert choice.run_samples is not None
    sizer = RunSizer(d, 4, 10**7, link=link, backend=choice.backend, security=security)
    assert sizer.efficient_run() == choice.run_samples[choice.backend]
    short = RunSizer(d, 4, 1000, link=link, backend=choice.backend, security=security)
    assert short.efficient_run() == 1000
    assert RunSizer(d, 4, 10**7).efficient_run() == 0  # no link: nothing to size by yet
    sizer.observe_call(0.05)
    sizer.observe_run(1000, 60.0, round_trips=0)  # 59.9 ms a sample beyond the two calls
    assert sizer.efficient_run() == 16  # 0.1 s of calls: at most 10% of a run of 16


def test_a_probe_h2_cannot_open_is_named_in_one_line(pki, tmp_path):
    """H2 dials the probe to a wrong gc_address: H1 stops saying where it waited."""
    d1, d2 = bind_pair(pki, tmp_path, **_AUTO_RUN, connect_timeout=5.0)
    d2.cfg.gc_address = "127.0.0.1:1"  # nothing listens there
    d2.start()
    d1.start()
    try:
        assert d1.wait(40)
        assert "backend auto: h2 opened no link probe to this server's gc_address" in str(d1.error)
    finally:
        d1.stop()
        d2.stop()


def test_h2_checks_the_trial_depth_h1_chose_with_gmw(pki, tmp_path):
    """Mode spgc: auto chooses gmw's trial depth with the backend. H2 takes H1's plan only
    when its figures give both: a slow link gives gmw with the unbounded trial (the fewest
    bytes); a plan naming gmw at another depth is refused in one line, the right one fixed."""
    d1, d2 = bind_pair(pki, tmp_path, **_AUTO_RUN)
    try:
        link = LinkFigures(rtt_seconds=0.0, bytes_per_second=1e5)
        want = choose_backend(AUTO, "spgc", d2.plan.share_dim, link)
        assert want.backend == "gmw" and want.trial_depth is not None

        def hello(depth: int) -> peer_pb2.PeerHello:
            config = d2.plan.training_config("run")
            config.backend, config.trial_depth = "gmw", depth
            return peer_pb2.PeerHello(
                protocol_version=PEER_PROTOCOL_VERSION, role=1, config=config,
                link_rtt_seconds=link.rtt_seconds, link_bytes_per_second=link.bytes_per_second,
            )  # fmt: skip

        other = next(c[1] for c in candidates("spgc") if c[1] not in (None, want.trial_depth))
        with pytest.raises(FailedPreconditionError, match=f"give '{want.label}'"):
            d2._check_backend_choice(hello(other))
        assert d2.cfg.backend == AUTO and d2.cfg.trial_depth is None  # nothing fixed
        d2._check_backend_choice(hello(want.trial_depth))
        assert (d2.cfg.backend, d2.cfg.trial_depth) == ("gmw", want.trial_depth)
        assert d2.plan.training_config("run").trial_depth == want.trial_depth
    finally:
        d1.stop()
        d2.stop()
