"""``security: semi-honest | malicious`` in the servers' config (issue 46 item 2): the default, a
value that is not a level, and every combination without a malicious variant, each refused in
one line that says what is supported (spgc.protocol.modes.MALICIOUS_VARIANTS)."""

from __future__ import annotations

import pytest

from spgc.protocol.modes import (
    BACKEND_NAMES,
    MALICIOUS_VARIANTS,
    TRAINING_MODES,
    malicious_refusal,
)
from spgc.settings.backend_choice import AUTO
from spgc.settings.config import ConfigError, ServerConfig

SUPPORTED = (
    "security: malicious needs backend: gmw and mode: spgc or preprocessed (authenticated GMW) "
    "or backend: gc and mode: spgc or preprocessed (authenticated garbling); "
)


def config(**kw) -> ServerConfig:
    base = {"role": 1, "insecure": True, "providers": ["p1", "p2"], "verify_inputs": "none"}
    return ServerConfig(**{**base, **kw})


def test_semi_honest_is_the_default_and_malicious_runs_on_both_authenticated_backends():
    assert config().security == "semi-honest"
    assert config(backend="gmw", security="malicious").security == "malicious"
    assert config(security="malicious").security == "malicious"  # backend gc, the default
    assert MALICIOUS_VARIANTS == {
        ("gmw", "spgc"): "authenticated GMW",
        ("gmw", "preprocessed"): "authenticated GMW",
        ("gc", "spgc"): "authenticated garbling",
        ("gc", "preprocessed"): "authenticated garbling",
    }
    assert config(backend="gmw", mode="preprocessed", pool_dir="p", security="malicious")
    assert config(mode="preprocessed", pool_dir="p", security="malicious")


def test_a_level_that_is_not_one_is_refused():
    with pytest.raises(ConfigError) as caught:
        config(security="paranoid")
    assert str(caught.value) == (
        "ServerConfig: security: Input should be 'semi-honest' or 'malicious' (given "
        "'paranoid'; allowed: one of 'semi-honest', 'malicious')"
    )


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"backend": "gmw", "mode": "only-mpc"}, "mode only-mpc has no malicious variant yet"),
        ({"mode": "only-mpc"}, "mode only-mpc has no malicious variant yet"),
        ({"mode": "dng"}, "mode dng has no malicious variant yet"),
        ({"mode": "plain"}, "mode plain has no malicious variant yet"),
        ({"mode": "ldp"}, "mode ldp has no malicious variant yet"),
    ],
)  # fmt: skip
def test_each_combination_without_a_malicious_variant_is_refused_in_one_line(kw, why):
    with pytest.raises(ConfigError) as caught:
        config(security="malicious", **kw)
    assert str(caught.value) == f"ServerConfig: {SUPPORTED}{why}"


@pytest.mark.parametrize("mode", ["spgc", "preprocessed"])
def test_backend_auto_is_malicious_where_every_backend_it_chooses_among_is(mode):
    """auto prices the authenticated engines under malicious (spgc.settings.backend_choice.
    cost_tables): either choice has a malicious variant in these modes."""
    extra = {"pool_dir": "p"} if mode == "preprocessed" else {}
    cfg = config(backend=AUTO, mode=mode, security="malicious", **extra)
    assert cfg.backend == AUTO and cfg.security == "malicious"


def test_the_ray_workers_have_no_malicious_variant():
    with pytest.raises(ConfigError) as caught:
        config(backend="gmw", security="malicious", workers=2)
    assert str(caught.value) == (
        "ServerConfig: security: malicious with workers: 2: the Ray worker pairs have no "
        "malicious variant yet; set workers: 1"
    )


def test_the_table_is_the_one_answer():
    """Every backend and training mode: refused exactly where the table has no row (auto:
    where some backend it could choose has none)."""
    for backend in (*BACKEND_NAMES, AUTO):
        for mode in TRAINING_MODES:
            refused = malicious_refusal(backend, mode)
            choices = BACKEND_NAMES if backend == AUTO else (backend,)
            assert (refused is None) == all((b, mode) in MALICIOUS_VARIANTS for b in choices)
            assert refused is None or refused.startswith(SUPPORTED)
