"""The ServerApp: FedAvg, wrapped by SPGC's strategy wrapper, which gives FedAvg the noisy
aggregate of SPGC's two servers and the privacy they count as spent. The global model is
evaluated here on the held-out split; the result is written as one JSON object."""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from spgc.app.flower import SpgcServers, SpgcStrategy, record_like
from spgc.wire.tls import TlsFiles
from spgcflower.task import accuracy, build_model, load_digits_data

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    tls_dir = str(cfg["spgc-tls-dir"])
    servers = SpgcServers(
        str(cfg["spgc-h1"]), str(cfg["spgc-h2"]), str(cfg["spgc-serverapp-name"]),
        insecure=not tls_dir,
        tls=TlsFiles.from_dir(Path(tls_dir), str(cfg["spgc-serverapp-name"])) if tls_dir else None,
    )  # fmt: skip
    _, _, x_test, y_test = load_digits_data()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = build_model()
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy(model, x_test, y_test)})

    try:
        # The Flower app starts from the servers' initial model.
        template = ArrayRecord(build_model().state_dict())
        initial = record_like(template, servers.model(0))
        # The one line SPGC changes in the ServerApp: the strategy, wrapped. Clients evaluate
        # nothing (their metrics would leave them without noise): the ServerApp evaluates.
        strategy = SpgcStrategy(FedAvg(fraction_evaluate=0.0), servers)
        rounds = int(cfg["num-server-rounds"])
        result = strategy.start(
            grid=grid, initial_arrays=initial, num_rounds=rounds, evaluate_fn=evaluate
        )
    finally:
        servers.close()
    last = max(result.train_metrics_clientapp)
    summary = {
        "rounds": rounds,
        "accuracy": round(result.evaluate_metrics_serverapp[rounds]["accuracy"], 4),
        "epsilon": round(float(result.train_metrics_clientapp[last]["epsilon"]), 4),
    }
    if cfg["result-file"]:
        Path(str(cfg["result-file"])).write_text(json.dumps(summary) + "\n")
