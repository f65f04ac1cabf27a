"""DP linear regression on three hospitals' features at their natural scales: raw, raw with
``standardize: true`` (the servers release the feature statistics privately), and standardised
by hand (issue 48 part 2).

Writes the data (three providers' CSVs and the servers' test set, generated from a known linear
model on clinical scales) under WORK, then trains three times through both servers and the
three providers (all in this process, spgc.app.api, plaintext localhost links) and prints one
JSON line with each run's test R^2.

With ``standardize: true`` the servers' round 0 is one DP release of every provider's per-feature
clipped sums, sums of squares and row count (through the same shares, circuit and exact discrete
Gaussian noise as a round, counted in the co-signed ledger before it is revealed); the providers
and the servers' test set then standardise with the released means and deviations, and the
exported model carries them (spgc.learning.export.load_model applies them).

    python compare.py [--work DIR] [--rounds R] [--stats-epsilon E]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spgc.app.api import ProviderConfig, ServerConfig, finish_server, run_provider, start_server
from spgc.learning.export import load_model, read_report
from spgc.learning.models import resolve_model
from spgc.privacy.accounting import quiet_dp_accounting
from spgc.privacy.feature_stats import Standardization
from spgc.privacy.ledger_verify import verify_ledger

HERE = Path(__file__).resolve().parent
PROVIDERS = ("p1", "p2", "p3")
# Each feature: its name, the declared range the release clips to, and how the synthetic
# patients are drawn (mean, std; the flag is 0/1).
FEATURES = (
    ("age", (18.0, 95.0), (55.0, 15.0)),
    ("sex", (0.0, 1.0), None),
    ("bmi", (15.0, 55.0), (28.0, 5.0)),
    ("systolic_bp", (80.0, 220.0), (130.0, 18.0)),
    ("ldl", (30.0, 300.0), (120.0, 35.0)),
    ("glucose", (50.0, 400.0), (105.0, 30.0)),
    ("creatinine", (0.3, 3.0), (1.0, 0.25)),
    ("triglycerides", (30.0, 600.0), (150.0, 60.0)),
)
COEF = np.array([0.35, 0.1, 0.45, 0.3, 0.25, 0.5, -0.2, 0.15])  # per standardised feature
ROWS_PER_PROVIDER, TEST_ROWS = 1500, 1500


def draw(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n synthetic patients on natural scales and their target (R^2 about 0.78 in the pool)."""
    cols = []
    for _, _, shape in FEATURES:
        cols.append(rng.integers(0, 2, n) if shape is None else rng.normal(*shape, n))
    x = np.column_stack(cols).astype(np.float64)
    means = np.array([0.5 if s is None else s[0] for _, _, s in FEATURES])
    stds = np.array([0.5 if s is None else s[1] for _, _, s in FEATURES])
    y = ((x - means) / stds) @ COEF
    y = y + rng.normal(0.0, 0.5 * y.std(), n)
    return x, (y - y.mean()) / y.std()


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    header = ",".join([name for name, _, _ in FEATURES] + ["y"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="", fmt="%.6g")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_config(
    folder: Path, rounds: int, epsilon: float, role: int, stats_epsilon: float | None, **kw: Any
) -> ServerConfig:
    """Both servers' plan on folder's test set (role 1: H1, 2: H2); ``stats_epsilon``: with
    standardize, the statistics release's epsilon (None: no release)."""
    if stats_epsilon is not None:
        kw.update(
            standardize=True,
            feature_ranges=[list(r) for _, r, _ in FEATURES],
            standardize_epsilon=stats_epsilon,
            standardize_max_rows=ROWS_PER_PROVIDER,
        )
    return ServerConfig(
        role=role,
        insecure=True,  # one process on localhost; a deployment gives every party TLS
        providers=list(PROVIDERS),
        dataset="",
        model=f"{HERE / 'model.py'}:linear",
        test_data=str(folder / "test.csv"),
        test_data_label="y",
        task="regression",
        max_batch_size=400,
        mode="spgc",
        rounds=rounds,
        min_providers=3,
        sampling_rate=0.1,
        lr=0.05,
        target_epsilon=epsilon,
        target_delta=1e-5,
        first_round_wait=60,
        state_dir=folder / f"h{role}",  # the ledger and the exported model
        **kw,
    )


def train(folder: Path, rounds: int, epsilon: float, stats_epsilon: float | None) -> dict[str, Any]:
    """One run through both servers and the three providers on folder's CSVs."""
    h1, h2, link, peer1, peer2 = (f"127.0.0.1:{free_port()}" for _ in range(5))
    providers = [
        ProviderConfig(
            name=name,
            h1_address=h1,
            h2_address=h2,
            insecure=True,
            task="regression",
            model=f"{HERE / 'model.py'}:linear",
            data=str(folder / f"{name}.csv"),
            data_label="y",
            max_total_epsilon=epsilon,  # the whole training's budget, no more
            min_noise_multiplier=0.5,
            # Each data set's budget file in the work folder, not the user's: the three runs
            # are of three data sets (the same rows, scaled three ways).
            state_dir=folder / name,
            standardize=stats_epsilon is not None,
        )
        for name in PROVIDERS
    ]
    servers = [
        start_server(server_config(folder, rounds, epsilon, 1, stats_epsilon, listen=h1,
                                   peer_listen=peer1, peer_address=peer2, peer_name="h2",
                                   gc_address=link)),
        start_server(server_config(folder, rounds, epsilon, 2, stats_epsilon, listen=h2,
                                   peer_listen=peer2, peer_address=peer1, peer_name="h1",
                                   gc_address=link)),
    ]  # fmt: skip
    try:
        with ThreadPoolExecutor(len(providers)) as pool:
            list(pool.map(run_provider, providers))
        summary = finish_server(servers[0], timeout=600)
        finish_server(servers[1], timeout=600)
    finally:
        for daemon in servers:
            daemon.stop()
    return summary


def exported_r2(folder: Path, test: tuple[np.ndarray, np.ndarray]) -> float:
    """R^2 of H1's exported model on the RAW test features, through the export's loader (which
    applies the statistics stored with a standardize run's model)."""
    architecture = resolve_model(f"{HERE / 'model.py'}:linear")  # the run's, fresh
    model = load_model(folder / "h1" / "model.safetensors", architecture)
    x = torch.as_tensor(test[0], dtype=torch.float32)
    with torch.no_grad():
        pred = model(x).numpy().ravel()
    return float(1 - np.mean((test[1] - pred) ** 2) / np.var(test[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="where the CSVs go")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--epsilon", type=float, default=4.0, help="each run's whole budget")
    parser.add_argument(
        "--stats-epsilon", type=float, default=0.5, help="the statistics release's share of it"
    )
    parser.add_argument("--skip-raw", action="store_true", help="leave out the raw run")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="spgc-standardize-"))
    rng = np.random.default_rng(48)  # synthetic patients only; the noise is the CSPRNG's
    parts = [draw(ROWS_PER_PROVIDER, rng) for _ in PROVIDERS]
    test = draw(TEST_ROWS, rng)
    pooled = np.concatenate([x for x, _ in parts])
    by_hand = Standardization(pooled.mean(axis=0), pooled.std(axis=0), float(len(pooled)))
    # label: (the CSVs' scaling, the statistics release's epsilon or None)
    runs = {"standardize": (None, args.stats_epsilon), "by_hand": (by_hand, None)}
    if not args.skip_raw:
        runs = {"raw": (None, None), **runs}
    result: dict[str, Any] = {}
    for label, (stats, stats_epsilon) in runs.items():
        folder = work / label
        folder.mkdir(parents=True, exist_ok=True)
        for name, (x, y) in [*zip(PROVIDERS, parts, strict=True), ("test", test)]:
            write_csv(folder / f"{name}.csv", x if stats is None else stats.apply(x), y)
        with quiet_dp_accounting():  # dp-accounting's notes on excluded orders
            summary = train(folder, args.rounds, args.epsilon, stats_epsilon)
        result[f"r2_{label}"] = round(float(summary["test_r2"]), 4)
        result[f"epsilon_{label}"] = round(float(summary["epsilon"]), 4)
        if stats_epsilon is not None:
            # What the servers released and stored with the model, and what it cost.
            report = read_report(folder / "h1" / "model.safetensors")
            released = report["feature_standardization"]
            result["released_mean"] = [round(v, 3) for v in released["feature_mean"]]
            result["released_std"] = [round(v, 3) for v in released["feature_std"]]
            result["true_mean"] = [round(float(v), 3) for v in pooled.mean(axis=0)]
            result["true_std"] = [round(float(v), 3) for v in pooled.std(axis=0)]
            ledger = verify_ledger(folder / "h1" / "ledger.jsonl")
            result["ledger_releases"] = ledger.steps
            result["ledger_feature_stats_releases"] = ledger.feature_stats_releases
            result["ledger_epsilon"] = round(float(ledger.epsilon or 0.0), 4)
            result["r2_standardize_export_on_raw_test"] = round(exported_r2(folder, test), 4)
    # For reference: least squares on the pooled raw data, no privacy (scale does not matter).
    design = np.column_stack([pooled, np.ones(len(pooled))])
    coef = np.linalg.lstsq(design, np.concatenate([y for _, y in parts]), rcond=None)[0]
    residual = test[1] - np.column_stack([test[0], np.ones(len(test[0]))]) @ coef
    result["r2_pooled_least_squares"] = round(1 - residual.var() / test[1].var(), 4)
    result["r2_gap_standardize_vs_by_hand"] = round(
        result["r2_by_hand"] - result["r2_standardize"], 4
    )
    result["stats_epsilon"] = args.stats_epsilon
    result["work"] = str(work)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
