"""Model export (spgc.learning.export, `spgc export`, the files a server's state_dir gets)."""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from helpers import REPO_ROOT, run_in_process
from test_server_daemon import PROVIDERS, Provider, start_pair, wait_round_done

from spgc.app import export_cmd
from spgc.learning.export import (
    StandardizedInputs,
    load_export,
    load_model,
    model_state_tensors,
    privacy_report,
    read_report,
    standardization_of,
    write_export,
)
from spgc.learning.models import build_model, flatten_params, load_flat_params
from spgc.privacy.feature_stats import Standardization
from spgc.protocol.certs import make_dev_pki
from spgc.servers.state_checkpoints import models_fit_disk

DOC = REPO_ROOT / "docs" / "EXPORT.md"


def _report(mode: str = "spgc", **kw) -> dict:
    values = {
        "mode": mode,
        "epsilon": 1.25,
        "delta": 1e-5,
        "steps": 7,
        "noise_multiplier": 1.5,
        "sampling": {"sampling": "poisson", "sampling_rate": 0.01},
        "clip_norm": 1.0,
        "scale": 1024.0,
        "sensitivity_units": 1100.0,
        "model": "cancer",
        "num_parameters": 62,
        "version": 7,
    }
    values.update(kw)
    return privacy_report(**values)


def _trained(name: str) -> np.ndarray:
    """A parameter vector unlike any seeded initialisation."""
    d = len(flatten_params(build_model(name)))
    return np.random.default_rng(5).normal(0.0, 0.3, d)


@pytest.mark.parametrize("name", ["cancer", "diabetes"])
def test_round_trip_into_a_fresh_module(tmp_path, name):
    flat = _trained(name)
    report = _report(model=name, num_parameters=len(flat))
    model_path, report_path = write_export(
        tmp_path / "m.safetensors", build_model(name), flat, report
    )
    assert (model_path, report_path) == (tmp_path / "m.safetensors", tmp_path / "m.json")
    assert model_path.stat().st_mode & 0o777 == 0o644
    assert json.loads(report_path.read_text()) == report
    assert not list(tmp_path.glob("*.tmp"))

    tensors, loaded_report = load_export(model_path)
    assert loaded_report == report
    fresh = build_model(name, seed=99)  # other initial weights: everything must be replaced
    fresh.load_state_dict(tensors)  # strict
    reference = build_model(name)
    load_flat_params(reference, flat)
    x = torch.randn(16, *{"cancer": (30,), "diabetes": (8,)}[name], generator=torch.Generator())
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), reference(x), rtol=0, atol=0)
    np.testing.assert_array_equal(flatten_params(fresh), flat.astype(np.float32))


def test_state_tensors_are_named_like_the_module():
    model = build_model("cancer")
    tensors = model_state_tensors(model, _trained("cancer"))
    assert sorted(tensors) == ["0.bias", "0.weight"]
    assert tensors["0.weight"].shape == (2, 30) and tensors["0.weight"].dtype == torch.float32
    assert all(t.is_contiguous() and t.device.type == "cpu" for t in tensors.values())
    tensors["0.bias"].zero_()  # a copy: the module is untouched
    assert model[0].bias.abs().sum() > 0


def test_report_fields():
    dp = _report("spgc", rounds=9, accountant="rdp", run_id="r1", dataset="cancer")
    assert dp["differentially_private"] is True
    assert (dp["epsilon"], dp["delta"], dp["steps"], dp["accountant"]) == (1.25, 1e-5, 7, "rdp")
    assert dp["noise_std_units"] == pytest.approx(1.5 * 1100.0)
    assert dp["sensitivity_units"] == 1100.0 and dp["clip_norm"] == 1.0 and dp["scale"] == 1024.0
    assert dp["sampling"] == {"sampling": "poisson", "sampling_rate": 0.01}
    assert (dp["version"], dp["rounds"], dp["noise_by"]) == (7, 9, "circuit")
    assert "differentially private after 7 step(s)" in dp["note"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", dp["created"])

    for mode in ("only-mpc", "plain"):
        none = _report(mode, epsilon=math.inf, noise_multiplier=0.0)
        assert none["differentially_private"] is False
        assert none["epsilon"] is None and none["delta"] is None
        assert none["note"].startswith("not differentially private")
    # Whatever epsilon is passed, a mode without DP reports none.
    assert _report("only-mpc", epsilon=0.5)["epsilon"] is None
    json.dumps(dp, allow_nan=False)
    json.dumps(none, allow_nan=False)


def test_refuses_another_suffix(tmp_path):
    out = tmp_path / "model.pt"
    with pytest.raises(ValueError, match=re.escape(str(out))):
        write_export(out, build_model("cancer"), _trained("cancer"), _report())
    with pytest.raises(ValueError, match="62"):  # a vector of another model
        write_export(tmp_path / "m.safetensors", build_model("cancer"), np.zeros(61), _report())
    missing = tmp_path / "exports" / "run-1"
    with pytest.raises(ValueError, match=f"^no directory {re.escape(str(missing))} to write m"):
        write_export(
            missing / "m.safetensors", build_model("cancer"), _trained("cancer"), _report()
        )
    assert list(tmp_path.iterdir()) == []


def test_the_documented_snippet_loads_the_model(tmp_path, monkeypatch, capsys):
    """docs/EXPORT.md's Python block, run as written."""
    snippet = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert snippet is not None
    flat = _trained("cancer")
    write_export(tmp_path / "model.safetensors", build_model("cancer"), flat, _report("plain"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet.group(1), str(DOC), "exec"), namespace)
    np.testing.assert_array_equal(flatten_params(namespace["model"]), flat.astype(np.float32))
    assert "warning: not differentially private" in capsys.readouterr().out


@pytest.fixture(scope="module")
def server_pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS])
    return root


def _export(state_dir: Path, out: Path, version: int | None = None) -> int:
    return export_cmd.run(argparse.Namespace(state_dir=state_dir, out=out, version=version))


def _dng_run(pki: Path, tmp_path: Path, rounds: int, **kw: Any) -> tuple[Any, Any]:
    """A dng run of ``rounds`` rounds by both daemons and PROVIDERS, to its end; the daemons."""
    d1, d2 = start_pair(pki, tmp_path, mode="dng", rounds=rounds, target_epsilon=8.0, **kw)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        for t in range(rounds):
            cfg = providers[0].wait_collecting(t)
            for i, p in enumerate(providers):
                p.submit_both(cfg, t, np.full(cfg.num_parameters, 100 * (i + 1), dtype=np.int64))
            wait_round_done((d1, d2), t)
        assert d1.wait(20) and d2.wait(20)
        assert d1.error is None and d2.error is None
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    return d1, d2


def test_server_run_leaves_the_model_and_spgc_export_writes_it(server_pki, tmp_path, capsys):
    d1, d2 = _dng_run(server_pki, tmp_path, rounds=2)

    final = d1.state.params
    for d, sub in ((d1, "s1"), (d2, "s2")):
        state_dir = tmp_path / sub
        tensors, report = load_export(state_dir / "model.safetensors")
        assert json.loads((state_dir / "model.json").read_text()) == report
        assert (report["version"], report["steps"], report["mode"]) == (2, 2, "dng")
        assert report["differentially_private"] is True
        assert report["epsilon"] == pytest.approx(d.state.epsilon())
        assert report["sensitivity_units"] == d.plan.fixed_point.l2_bound_units
        assert report["noise_multiplier"] == d.plan.noise_multiplier > 0
        module = build_model("cancer", seed=1)
        module.load_state_dict(tensors)
        np.testing.assert_array_equal(flatten_params(module), final.astype(np.float32))
        kept = sorted(p.name for p in (state_dir / "models").iterdir())
        # v0, the start, is checkpointed (and kept) before the first round
        assert kept == [f"v{v:05d}.{ext}" for v in (0, 1, 2) for ext in ("json", "safetensors")]

    s1 = tmp_path / "s1"
    assert _export(s1, tmp_path / "out.safetensors") == 0
    tensors, report = load_export(tmp_path / "out.safetensors")
    assert report == json.loads((s1 / "model.json").read_text())
    assert json.loads((tmp_path / "out.json").read_text()) == report
    module = build_model("cancer")
    module.load_state_dict(safetensors.torch.load_file(tmp_path / "out.safetensors"))
    np.testing.assert_array_equal(flatten_params(module), final.astype(np.float32))

    # The export names the co-signed ledger head its model depends on; the ledgers hold it.
    assert report["ledger_head"]["releases"] == 2
    ledgers = [str(tmp_path / sub / "ledger.jsonl") for sub in ("s1", "s2")]
    model = str(tmp_path / "out.json")
    covered = run_in_process("account", "--ledger", *ledgers, "--model", model)
    assert covered.returncode == 0 and "complete: it holds the head of the model" in covered.stdout

    assert _export(s1, tmp_path / "v1.safetensors", version=1) == 0
    first, report = load_export(tmp_path / "v1.safetensors")
    assert report["version"] == 1 and report["steps"] == 1
    kept = safetensors.torch.load_file(s1 / "models" / "v00001.safetensors")
    assert first.keys() == kept.keys() and all(torch.equal(first[k], kept[k]) for k in first)
    assert "warning" not in capsys.readouterr().err
    assert _export(s1, tmp_path / "v0.safetensors", version=0) == 0  # the start: said so
    assert "the initial model: no training step" in capsys.readouterr().err

    for args in (
        (s1, tmp_path / "x.safetensors", 7),  # no such version
        (tmp_path / "missing", tmp_path / "x.safetensors", None),
        (tmp_path, tmp_path / "x.safetensors", None),  # a directory without a checkpoint
        (s1, tmp_path / "x.pt", None),
    ):
        assert _export(*args) == 2
        err = capsys.readouterr().err
        assert err.startswith("spgc export: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "x.safetensors").exists()

    # The report is held to the ledger: an edited checkpoint cannot lower the epsilon ...
    true_eps = report_of(s1)["epsilon"]
    record = json.loads((s1 / "checkpoint.json").read_text())
    record["report"]["epsilon"] = 0.5
    (s1 / "checkpoint.json").write_text(json.dumps(record))
    assert _export(s1, tmp_path / "edited.safetensors") == 0
    assert "the ledger counts 2 release(s)" in capsys.readouterr().err
    _, edited = load_export(tmp_path / "edited.safetensors")
    assert edited["epsilon"] == pytest.approx(true_eps) and edited["releases_counted"] == 2
    # ... a ledger cut before the model's head (a valid prefix) does not cover it ...
    lines = (s1 / "ledger.jsonl").read_text().splitlines()
    (s1 / "ledger.jsonl").write_text("\n".join(lines[:3]) + "\n")  # header, release 0, released
    assert _export(s1, tmp_path / "short.safetensors") == 2
    assert "depends on 2 release(s), the ledger holds only 1" in capsys.readouterr().err
    # ... and a ledger that does not verify vouches for nothing.
    (s1 / "ledger.jsonl").write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    assert _export(s1, tmp_path / "cut.safetensors") == 2
    assert "does not verify" in capsys.readouterr().err


def report_of(state_dir: Path) -> dict:
    return json.loads((state_dir / "model.json").read_text())


def test_a_new_run_sets_the_old_runs_models_aside(tmp_path):
    """resume: false over an old state_dir: the first model the new run writes moves the old
    run's models/ to models.<old run id>, so `spgc export --version N` cannot read them as the
    new run's; a resumed run (same id) keeps its directory."""
    from types import SimpleNamespace

    from spgc.servers.state import ServerState

    models = tmp_path / "models"
    models.mkdir()
    (models / "v00003.json").write_text(json.dumps({"run_id": "old-run"}))
    (models / "v00003.safetensors").write_bytes(b"x")
    ServerState._set_aside_other_runs_models(SimpleNamespace(run_id="old-run"), models)
    assert (models / "v00003.json").exists()  # the same run: kept
    ServerState._set_aside_other_runs_models(SimpleNamespace(run_id="new-run"), models)
    assert not models.exists()
    assert (tmp_path / "models.old-run" / "v00003.safetensors").read_bytes() == b"x"


def test_the_released_feature_statistics_travel_with_the_model_and_its_loader_applies_them(
    tmp_path,
):
    from_stats = Standardization(
        np.array([55.0, 180.0, 0.5]), np.array([12.0, 40.0, 0.5]), count=900.0
    )
    linear = torch.nn.Linear(3, 1)
    flat = np.random.default_rng(7).normal(0.0, 0.5, 4)
    report = _report(model="linear", num_parameters=4, standardization=from_stats)
    path, _ = write_export(tmp_path / "m.safetensors", linear, flat, report)
    assert read_report(path)["feature_standardization"] == from_stats.to_dict()
    assert read_report(path)["note"].endswith("after 7 step(s) and the feature statistics' release")
    assert standardization_of(read_report(path)).to_dict() == from_stats.to_dict()
    loaded = load_model(path, torch.nn.Linear(3, 1))
    assert isinstance(loaded, StandardizedInputs)
    raw = torch.tensor([[70.0, 260.0, 1.0], [40.0, 100.0, 0.0]])
    inner = torch.nn.Linear(3, 1)
    load_flat_params(inner, flat)
    expected = inner((raw - torch.tensor([55.0, 180.0, 0.5])) / torch.tensor([12.0, 40.0, 0.5]))
    assert torch.allclose(loaded(raw), expected)
    with pytest.raises(ValueError, match="trained on 3 standardised features"):
        loaded(torch.zeros(1, 4))


def test_a_model_without_standardisation_loads_as_it_is(tmp_path):
    flat = _trained("cancer")
    path, _ = write_export(
        tmp_path / "m.safetensors", build_model("cancer"), flat, _report(num_parameters=len(flat))
    )
    assert read_report(path)["feature_standardization"] is None
    loaded = load_model(path, build_model("cancer"))
    assert not isinstance(loaded, StandardizedInputs)
    assert np.allclose(flatten_params(loaded), flat)
    with pytest.raises(ValueError, match="the weights do not fit the model given"):
        load_model(path, build_model("diabetes"))


def test_keep_models_bounds_the_kept_versions_and_export_names_them(server_pki, tmp_path, capsys):
    """keep_models: 2 keeps the latest two versions in state_dir/models; spgc export of an
    older one says which are kept."""
    _dng_run(server_pki, tmp_path, rounds=3, keep_models=2)
    for sub in ("s1", "s2"):
        kept = sorted(p.name for p in (tmp_path / sub / "models").iterdir())
        assert kept == [f"v{v:05d}.{ext}" for v in (2, 3) for ext in ("json", "safetensors")]
    s1 = tmp_path / "s1"
    assert _export(s1, tmp_path / "v2.safetensors", version=2) == 0
    assert _export(s1, tmp_path / "v1.safetensors", version=1) == 2
    assert "no model version 1" in (err := capsys.readouterr().err) and "kept: v2 to v3" in err


def test_a_run_whose_every_model_version_would_not_fit_is_warned_of(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert models_fit_disk(tmp_path, 1 << 20, 10) is None  # 11 MB
    why = models_fit_disk(tmp_path, free // 4, 10)  # about 2.75 times the free space
    assert why is not None and "set keep_models" in why and "GB are free" in why
