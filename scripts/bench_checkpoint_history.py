"""How long a server's checkpoint takes as a run grows: ``save_checkpoint`` once a round for
ROUNDS rounds of PROVIDERS providers each, with the round history inline in checkpoint.json
(how checkpoints were written before the history file) and appended to the history file
(how they are written now). Prints the median time of the first and last 50 saves and the
size of checkpoint.json.

    .venv/bin/python scripts/bench_checkpoint_history.py [ROUNDS] [PROVIDERS]   (600 1000)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from spgc.servers.checkpoint import save_checkpoint


def main(rounds: int = 600, providers: int = 1000) -> None:
    names = [f"provider-{i:05d}" for i in range(providers)]
    arrays = {"params": np.zeros(1000)}
    for how in ("inline", "appended"):
        directory = Path(tempfile.mkdtemp(prefix="spgc-history-"))
        history, seconds = [], []
        try:
            for t in range(rounds):
                entry = {"round": t, "published": True, "received": names, "agreed": names}
                history.append(entry)
                record = {"round": t + 1, "version": t + 1, "run_id": "bench"}
                start = time.perf_counter()
                if how == "inline":
                    save_checkpoint(directory, {**record, "history": history}, arrays)
                else:
                    save_checkpoint(directory, record, arrays, new_history=[entry])
                seconds.append(time.perf_counter() - start)
            size = (directory / "checkpoint.json").stat().st_size
        finally:
            shutil.rmtree(directory)
        print(
            f"{how}: {rounds} rounds of {providers} providers: median save "
            f"{1000 * np.median(seconds[:50]):.1f} ms over the first 50 rounds, "
            f"{1000 * np.median(seconds[-50:]):.1f} ms over the last 50; checkpoint.json "
            f"{size / 1e3:,.1f} kB"
        )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
