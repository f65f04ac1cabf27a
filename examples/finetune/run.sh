#!/usr/bin/env bash
# Runs the fine-tuning example: pretrains the backbone on the public digits 0-4 (pretrain.py,
# once: backbone.safetensors), then the README's commands (H1, H2 and three providers, in the
# background, through ../run-example.sh), and prints one JSON line: rounds, accuracy, epsilon,
# coordinates (the trained parameters, what travels), ranges (their runs in the model's flat
# vector, as the plan carries them), gc_bytes (between the servers), ...
#
#   bash run.sh         # LoRA adapters and a new head (model.py:factory, this folder's YAML)
#   bash run.sh full    # full fine-tuning, every parameter trained (full/*.yaml), to compare
#   bash run.sh sparse  # low-rank factors and a sparse masked part (model.py:sparse_lowrank,
#                       # sparse/*.yaml), to compare
#
# Which spgc (SPGC=/path/to/spgc, else spgc on PATH, else the .venv of the checkout around this
# folder) and the ports (SPGC_PORT_BASE=N moves them): as ../run-example.sh says.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-adapters}" in
    adapters) dir="$here" factory=factory ;;
    full) dir="$here/full" factory=full ;;
    sparse) dir="$here/sparse" factory=sparse_lowrank ;;
    *) echo "usage: run.sh [adapters|full|sparse]" >&2; exit 2 ;;
esac

SPGC=$(bash "$here/../run-example.sh" --which-spgc "$dir") || exit 2
export SPGC
# The Python of that installation (torch, scikit-learn, safetensors): its script's #! line.
PYTHON=$(sed -n '1s/^#![[:space:]]*//p' "$SPGC")
[[ -x "$PYTHON" ]] || PYTHON="$(dirname "$SPGC")/python"

if [[ ! -f "$here/backbone.safetensors" ]]; then
    "$PYTHON" "$here/pretrain.py" "$here/backbone.safetensors" >&2
fi

# Each run starts over: the providers' privacy budget files (state/p*/) go with the old state.
rm -rf "$dir/state/p1" "$dir/state/p2" "$dir/state/p3"
result=$(bash "$here/../run-example.sh" "$dir" | tail -n 1)
# The same line with the number of trained coordinates (the length of every share vector:
# requires_grad and trainable masks, as the servers count them) and their ranges.
"$PYTHON" - "$here" "$factory" "$result" <<'EOF'
import json
import sys

from spgc.learning.models import parameter_count
from spgc.learning.trainable import TrainableCoordinates

sys.path.insert(0, sys.argv[1])
import model  # noqa: E402

net = getattr(model, sys.argv[2])()
trained = TrainableCoordinates.of_model(net)
out = json.loads(sys.argv[3])
out["coordinates"] = trained.count
out["ranges"] = len(trained.ranges)
out["parameters"] = parameter_count(net)
print(json.dumps(out))
EOF
