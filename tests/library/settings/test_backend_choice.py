"""backend: auto's cost model (spgc.settings.backend_choice) on made-up links."""

from __future__ import annotations

import math

import pytest

from spgc.protocol.modes import BACKEND_NAMES
from spgc.settings.backend_choice import (
    AUTO,
    AUTO_MODES,
    CALLS_PER_RUN,
    GMW_DEPTH_COSTS,
    GMW_EXCHANGE_SHARE,
    MALICIOUS_GMW_DEPTH_COSTS,
    MALICIOUS_NOISE_COSTS,
    MALICIOUS_ROUND_COSTS,
    MAX_RUN_ROUNDS,
    NOISE_COSTS,
    ROUND_COSTS,
    RUN_OVERHEAD_SHARE,
    LinkFigures,
    candidate_label,
    candidates,
    choose_backend,
    cost_tables,
    expected_seconds,
    production_costs,
)
from spgc.settings.config import ConfigError, ServerConfig

MBIT = 1e6 / 8  # bytes per second in a Mbit/s


def test_a_slow_far_link_and_a_small_model_take_the_backend_with_fewer_round_trips():
    link = LinkFigures(rtt_seconds=0.050, bytes_per_second=100 * MBIT)
    choice = choose_backend(AUTO, "spgc", 62, link)
    fewer_trips = min(BACKEND_NAMES, key=lambda b: ROUND_COSTS[b].round_trips)
    assert choice.backend == fewer_trips
    assert choice.expected is not None and choice.link == link
    assert "round trips" in choice.reason


@pytest.mark.parametrize(
    ("rtt", "mbit", "d"), [(0.001, 1e5, 28_938), (0.010, 100, 28_938), (0.050, 1000, 100_000)]
)
def test_the_choice_is_the_least_of_the_models_own_expected_times(rtt, mbit, d):
    link = LinkFigures(rtt_seconds=rtt, bytes_per_second=mbit * MBIT)
    choice = choose_backend(AUTO, "spgc", d, link)

    def cost_of(candidate):
        backend, depth = candidate
        return ROUND_COSTS[backend] if depth is None else GMW_DEPTH_COSTS[depth]

    options = candidates("spgc")
    assert choice.expected == {
        candidate_label(c): expected_seconds(cost_of(c), link, d) for c in options
    }
    assert choice.label == min(choice.expected, key=choice.expected.__getitem__)
    for c in options:  # its terms, as the module's docstring writes them
        cost = cost_of(c)
        want = cost.round_trips * cost.trip_share * rtt + d * (
            cost.bytes_per_coordinate / link.bytes_per_second + cost.cpu_seconds_per_coordinate
        )
        assert math.isclose(choice.expected[candidate_label(c)], want)
    line = choice.log_line()
    assert f"chose {choice.label}" in line and f"{1000 * rtt:.2f} ms" in line


def test_bandwidth_moves_a_large_model_from_one_backend_to_the_other():
    """The model's own numbers: at 100 Mbit/s gc's bytes dominate, with no limit its CPU is
    the smaller; the two choices differ exactly when the expected times cross."""
    d = 28_938
    slow = choose_backend(AUTO, "spgc", d, LinkFigures(0.001, 100 * MBIT))
    fast = choose_backend(AUTO, "spgc", d, LinkFigures(0.001, 1e6 * MBIT))
    assert slow.expected is not None and fast.expected is not None
    assert slow.expected["gc"] > slow.expected[slow.label] and slow.backend == "gmw"
    assert fast.expected["gc"] < min(v for k, v in fast.expected.items() if k != "gc")
    assert fast.backend == "gc" and fast.trial_depth is None


def test_on_gmw_the_round_trip_chooses_the_trial_depth():
    """Mode spgc on gmw: a far link takes the shallow trial (fewer round trips), a near one
    the unbounded (the fewest AND gates: bytes and CPU), MNIST's d at 100 Mbit/s; the depth is
    in the choice, its label, the log line and the summary."""
    d = 28_938
    far = choose_backend(AUTO, "spgc", d, LinkFigures(0.200, 100 * MBIT))
    near = choose_backend(AUTO, "spgc", d, LinkFigures(0.001, 100 * MBIT))
    assert far.backend == near.backend == "gmw"
    assert far.trial_depth is not None and near.trial_depth is not None
    assert far.trial_depth < near.trial_depth == max(GMW_DEPTH_COSTS)
    assert near.label == "gmw/unbounded" and far.label == f"gmw/{far.trial_depth}"
    assert near.summary()["trial_depth"] == near.trial_depth
    assert "chose gmw/unbounded" in near.log_line()
    # mode preprocessed's production runs gmw at its default depth: no depth to choose
    pre = choose_backend(AUTO, "preprocessed", d, LinkFigures(0.001, 100 * MBIT))
    assert pre.trial_depth is None and set(pre.expected or {}) == set(BACKEND_NAMES)
    # an explicit backend chooses no depth (the config's trial_depth, if any, is the plan's)
    assert choose_backend("gmw", "spgc", d, None).trial_depth is None


def test_an_explicit_backend_wins_whatever_the_link():
    link = LinkFigures(0.050, 100 * MBIT)
    auto = choose_backend(AUTO, "spgc", 62, link).backend
    other = next(b for b in BACKEND_NAMES if b != auto)
    explicit = choose_backend(other, "spgc", 62, link)
    assert explicit.backend == other and not explicit.automatic
    assert explicit.reason == "set in the plan"
    assert choose_backend(other, "spgc", 62, None).backend == other


def test_preprocessed_sizes_production_runs_to_amortise_their_round_trips():
    d = 1000
    near = choose_backend(AUTO, "preprocessed", d, LinkFigures(0.001, 1000 * MBIT))
    far = choose_backend(AUTO, "preprocessed", d, LinkFigures(0.050, 1000 * MBIT))
    assert near.run_samples is not None and far.run_samples is not None
    for b in BACKEND_NAMES:
        assert far.run_samples[b] > near.run_samples[b]  # a longer round trip: longer runs
        cost, link = NOISE_COSTS[b], far.link
        assert link is not None
        per_sample = cost.bytes_per_coordinate / link.bytes_per_second + (
            cost.cpu_seconds_per_coordinate
        )
        fixed = (cost.round_trips * cost.trip_share + CALLS_PER_RUN) * link.rtt_seconds
        assert production_costs(b, link) == pytest.approx((fixed, per_sample))
        n = far.run_samples[b]
        # the fewest samples whose round trips are at most the share of the run's time, unless
        # the cap (MAX_RUN_ROUNDS rounds' noise) binds first
        if n < MAX_RUN_ROUNDS * d:
            assert fixed <= RUN_OVERHEAD_SHARE * (fixed + n * per_sample) * (1 + 1e-9)
        else:
            assert n == MAX_RUN_ROUNDS * d
        assert fixed > RUN_OVERHEAD_SHARE * (fixed + (n - 1) * per_sample)
    assert far.summary()["production_run_samples"] == far.run_samples[far.backend]
    assert "production runs of" in far.log_line()


def test_both_servers_get_the_same_choice_from_the_same_figures():
    link = LinkFigures(0.0123456789, 123_456_789.123)
    assert choose_backend(AUTO, "spgc", 5000, link) == choose_backend(AUTO, "spgc", 5000, link)


@pytest.mark.parametrize(
    ("requested", "d", "link", "says"),
    [
        ("auto", 62, None, "measured figures"),
        ("auto", 0, LinkFigures(0.01, 1e6), "coordinates"),
        ("fast", 62, LinkFigures(0.01, 1e6), "backend must be"),
    ],
)
def test_what_cannot_be_chosen_is_refused_in_one_line(requested, d, link, says):
    with pytest.raises(ValueError, match=says):
        choose_backend(requested, "spgc", d, link)
    with pytest.raises(ValueError, match="chooses in modes spgc, preprocessed, not only-mpc"):
        choose_backend(AUTO, "only-mpc", 62, LinkFigures(0.01, 1e6))


def test_the_servers_config_takes_auto_where_the_choice_is_modelled(tmp_path):
    base = {"insecure": True, "providers": ["p1", "p2"], "backend": AUTO, "state_dir": tmp_path}
    for mode in AUTO_MODES:
        assert ServerConfig(**base, mode=mode).backend == AUTO
    with pytest.raises(ConfigError, match="backend: auto with mode only-mpc"):
        ServerConfig(**base, mode="only-mpc")
    with pytest.raises(ConfigError, match="backend: auto evaluates a round's circuits"):
        ServerConfig(**base, mode="dng")


@pytest.mark.parametrize(("rtt", "rate"), [(-1.0, 1e6), (math.nan, 1e6), (0.01, 0.0)])
def test_impossible_link_figures_are_refused(rtt, rate):
    with pytest.raises(ValueError):
        LinkFigures(rtt, rate)


def test_gmws_exchanges_cost_half_a_round_trip_and_gcs_a_whole_one():
    """An AND layer's exchange has both servers send at once: the model charges gmw half the
    link's round trip per counted exchange (GMW_EXCHANGE_SHARE), gc's round trips whole ones.
    At 10 ms and 100 Mbit/s, cancer's d, that makes gmw the faster, as bench wan measured it."""
    link = LinkFigures(rtt_seconds=0.010, bytes_per_second=100 * MBIT)
    for depth, cost in GMW_DEPTH_COSTS.items():
        assert cost.trip_share == GMW_EXCHANGE_SHARE == 0.5, depth
        assert cost.trip_seconds(link) == pytest.approx(cost.round_trips * 0.005)
    assert NOISE_COSTS["gmw"].trip_share == 0.5
    assert ROUND_COSTS["gc"].trip_share == NOISE_COSTS["gc"].trip_share == 1.0
    choice = choose_backend(AUTO, "spgc", 62, link)
    assert choice.label == "gmw/28", choice.expected
    assert choose_backend(AUTO, "spgc", 62, LinkFigures(0.050, 100 * MBIT)).backend == "gc"


@pytest.mark.parametrize(
    ("rtt", "mbit", "d"), [(0.050, 1000, 30), (0.001, 100, 28_938), (0.010, 100, 28_938)]
)
def test_under_malicious_auto_prices_the_authenticated_engines(rtt, mbit, d):
    """security: malicious: every candidate's expected time is the model's on the
    authenticated engines' costs (MALICIOUS_* tables), never the semi-honest ones."""
    link = LinkFigures(rtt_seconds=rtt, bytes_per_second=mbit * MBIT)
    choice = choose_backend(AUTO, "spgc", d, link, "malicious")
    options = candidates("spgc", "malicious")
    assert {c[1] for c in options if c[0] == "gmw"} == set(MALICIOUS_GMW_DEPTH_COSTS)

    def cost_of(candidate):
        backend, depth = candidate
        return MALICIOUS_ROUND_COSTS[backend] if depth is None else MALICIOUS_GMW_DEPTH_COSTS[depth]

    assert choice.expected == {
        candidate_label(c): expected_seconds(cost_of(c), link, d) for c in options
    }
    assert choice.label == min(choice.expected, key=choice.expected.__getitem__)
    for c in options:  # the docstring's terms, with the round trips that grow with d
        cost = cost_of(c)
        trips = cost.round_trips + d * cost.round_trips_per_coordinate
        want = trips * cost.trip_share * rtt + d * (
            cost.bytes_per_coordinate / link.bytes_per_second + cost.cpu_seconds_per_coordinate
        )
        assert choice.expected[candidate_label(c)] == pytest.approx(want)


def test_under_malicious_a_small_model_far_away_garbles_and_a_large_one_nearby_runs_gmw():
    """Authenticated garbling's round has the fewest round trips, authenticated GMW's the fewest
    bytes and CPU: cancer's d at 50 ms takes gc, MNIST's on a 1 ms, 100 Mbit/s link gmw."""
    far = choose_backend(AUTO, "spgc", 30, LinkFigures(0.050, 1000 * MBIT), "malicious")
    assert far.backend == "gc", far.expected
    near = choose_backend(AUTO, "spgc", 28_938, LinkFigures(0.001, 100 * MBIT), "malicious")
    assert near.backend == "gmw", near.expected


def test_under_malicious_production_runs_are_sized_on_the_authenticated_costs():
    link = LinkFigures(0.010, 100 * MBIT)
    choice = choose_backend(AUTO, "preprocessed", 28_938, link, "malicious")
    assert choice.run_samples is not None
    for backend, cost in MALICIOUS_NOISE_COSTS.items():
        fixed, per_sample = production_costs(backend, link, "malicious")
        assert fixed == pytest.approx(
            cost.round_trips * cost.trip_share * 0.010 + CALLS_PER_RUN * 0.010
        )
        assert per_sample == pytest.approx(
            cost.bytes_per_coordinate / link.bytes_per_second
            + cost.cpu_seconds_per_coordinate
            + cost.round_trips_per_coordinate * cost.trip_share * 0.010
        )
        assert cost.round_trips_per_coordinate > 0  # the triples' chunks
        assert choice.run_samples[backend] == min(
            MAX_RUN_ROUNDS * 28_938,
            math.ceil(fixed * (1 - RUN_OVERHEAD_SHARE) / RUN_OVERHEAD_SHARE / per_sample),
        )


def test_an_unknown_security_level_is_refused():
    with pytest.raises(ValueError, match="security must be one of semi-honest, malicious"):
        cost_tables("paranoid")
