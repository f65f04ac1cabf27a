"""The ClientApp: an ordinary Flower ClientApp (train on the arrays received, reply with the
trained arrays), plus SPGC's mod. The mod sends the update to SPGC's two servers as shares and
replaces it in the reply: the ServerApp never sees it."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from spgc.app.flower import spgc_mod
from spgcflower.task import build_model, partition, train


def node_data(context: Context):  # noqa: ANN201 (x, y arrays)
    return partition(
        int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )


app = ClientApp(mods=[spgc_mod(node_data)])  # the one line SPGC adds to the ClientApp


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = build_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = node_data(context)
    loss = train(
        model, x, y, int(context.run_config["local-epochs"]), float(context.run_config["lr"])
    )
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(x)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)
