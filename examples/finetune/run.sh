#!/usr/bin/env bash
# Runs the fine-tuning example: pretrains the backbone on the public digits 0-4 (pretrain.py,
# once: backbone.safetensors), then the README's commands (H1, H2 and three providers, in the
# background, through ../run-example.sh), and prints one JSON line: rounds, accuracy, epsilon,
# coordinates (the trained parameters, what travels), gc_bytes (between the servers), ...
#
#   bash run.sh        # LoRA adapters and a new head (model.py:factory, this folder's YAML)
#   bash run.sh full   # full fine-tuning, every parameter trained (full/*.yaml), to compare
#
# SPGC=/path/to/spgc picks an installation (default: spgc on PATH, else the repository's .venv).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-adapters}" in
    adapters) dir="$here" factory=factory ;;
    full) dir="$here/full" factory=full ;;
    *) echo "usage: run.sh [adapters|full]" >&2; exit 2 ;;
esac

repo_spgc="$(cd "$here/../.." && pwd)/.venv/bin/spgc"
SPGC=${SPGC:-$(command -v spgc || echo "$repo_spgc")}
if [[ ! -x "$SPGC" ]]; then
    echo "run.sh: no spgc found (not on PATH, not $repo_spgc); set SPGC=/path/to/spgc" >&2
    exit 2
fi
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
# The same line with the number of trained coordinates (the length of every share vector).
"$PYTHON" - "$here" "$factory" "$result" <<'EOF'
import json
import sys

sys.path.insert(0, sys.argv[1])
import model  # noqa: E402

net = getattr(model, sys.argv[2])()
out = json.loads(sys.argv[3])
out["coordinates"] = sum(p.numel() for p in net.parameters() if p.requires_grad)
out["parameters"] = sum(p.numel() for p in net.parameters())
print(json.dumps(out))
EOF
