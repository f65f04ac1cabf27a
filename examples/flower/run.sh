#!/usr/bin/env bash
# Runs the Flower example: SPGC's two servers (spgc server, h1.yaml, h2.yaml), a Flower
# SuperLink of our own and the Flower app (flwr run), and prints, as its last line, one JSON
# object: {"rounds": ..., "accuracy": ..., "epsilon": ...} (the ServerApp's global model on the
# held-out digits, and the privacy both SPGC servers count as spent).
#
#   bash run.sh                        # Flower's simulation engine (two simulated nodes)
#   bash run.sh deployment             # Flower's deployment mode: two SuperNodes
#   SPGC_FLOWER_ROUNDS=3 bash run.sh   # fewer rounds (servers and app alike)
#   SPGC_FLOWER_EPSILON=100 bash run.sh  # the servers' target_epsilon (default h1.yaml's, 8)
#   SPGC_PORT_BASE=41000 bash run.sh   # ports N+1.. instead of 50351.. (below)
#   SPGC=/path/to/spgc bash run.sh     # spgc (and flwr, flower-superlink beside it)
#
# spgc: $SPGC, else `spgc` on PATH, else the first .venv/bin/spgc in a folder above; flwr,
# flower-superlink and flower-supernode are taken from the same folder (pip install
# 'spgc[flower]' puts them there). Logs in logs/, state (Flower's FLWR_HOME too) in state/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
here=$(pwd -P)
mode=${1:-simulation}
case "$mode" in
    simulation | deployment) ;;
    *) echo "usage: run.sh [simulation|deployment]" >&2; exit 2 ;;
esac
rounds=${SPGC_FLOWER_ROUNDS:-20}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: SPGC_FLOWER_ROUNDS=$rounds: expected a whole number >= 1" >&2; exit 2; }
base=${SPGC_PORT_BASE:-50350}
[[ $base =~ ^[0-9]+$ ]] && ((base >= 1024 && base <= 65535 - 50)) || {
    echo "run.sh: SPGC_PORT_BASE=$base: expected a whole number from 1024 to 65485" >&2
    exit 2
}
at() { echo "127.0.0.1:$((base + $1))"; }

find_spgc() {
    if [[ -n "${SPGC:-}" ]]; then
        [[ -x "$SPGC" ]] && { echo "$SPGC"; return; }
        echo "run.sh: SPGC=$SPGC is not an executable file" >&2
        return 2
    fi
    command -v spgc >/dev/null && { command -v spgc; return; }
    local dir=$here
    while true; do
        [[ -x "$dir/.venv/bin/spgc" ]] && { echo "$dir/.venv/bin/spgc"; return; }
        [[ "$dir" == / ]] && break
        dir=$(dirname "$dir")
    done
    echo "run.sh: no spgc found: none on PATH and no .venv/bin/spgc in a folder above $here" >&2
    return 2
}
SPGC=$(find_spgc) || exit 2
bin=$(dirname "$SPGC")
for tool in flwr flower-superlink flower-supernode python; do
    [[ -x "$bin/$tool" ]] || {
        echo "run.sh: $bin/$tool is missing: pip install 'spgc[flower]' into that environment" >&2
        exit 2
    }
done

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

if [[ ! -f certs/ca.pem ]]; then
    "$SPGC" certs certs --names h1 h2 --providers flower-0 flower-1 flower-server >/dev/null
fi
rm -rf state logs
mkdir -p state logs

server_sets=(--set "rounds=$rounds" --set "gc_address=$(at 11)")
if [[ -n "${SPGC_FLOWER_EPSILON:-}" ]]; then
    server_sets+=(--set "target_epsilon=$SPGC_FLOWER_EPSILON")
fi
"$SPGC" server --config h1.yaml "${server_sets[@]}" --set "listen=$(at 1)" \
    --set "peer_listen=$(at 21)" --set "peer_address=$(at 22)" >logs/h1.log 2>&1 &
pids+=($!)
"$SPGC" server --config h2.yaml "${server_sets[@]}" --set "listen=$(at 2)" \
    --set "peer_listen=$(at 22)" --set "peer_address=$(at 21)" >logs/h2.log 2>&1 &
pids+=($!)

# Flower: a SuperLink of our own (not the CLI's detached local one), on our ports, with its
# FLWR_HOME here; the app's dependencies are those installed (no installation at run time).
export FLWR_HOME=$here/state/flwr-home
mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "spgc"

[superlink.spgc]
address = "$(at 31)"
insecure = true
TOML
# One HTTP port serves its Control, Fleet and Runtime APIs (Flower 1.42).
superlink=("$bin/flower-superlink" --insecure --isolation subprocess
           --disable-runtime-dependency-installation --host 127.0.0.1 --port "$((base + 31))")
[[ $mode == simulation ]] && superlink+=(--simulation)
PATH="$bin:$PATH" "${superlink[@]}" >logs/superlink.log 2>&1 &
pids+=($!)
if [[ $mode == deployment ]]; then
    for i in 0 1; do
        PATH="$bin:$PATH" "$bin/flower-supernode" --insecure --superlink "$(at 31)" \
            --isolation subprocess --port "$((base + 41 + i))" \
            --node-config "partition-id=$i num-partitions=2" >"logs/supernode$i.log" 2>&1 &
        pids+=($!)
    done
fi

# flwr run once the SuperLink's Control API listens (and, deployed, both SuperNodes' APIs).
wait_port() {
    local port=$1 what=$2 log=$3 end=$((SECONDS + 120))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ((SECONDS > end)); then
            echo "run.sh: $what did not listen on port $port within 120 s ($log):" >&2
            tail -n 20 "$log" >&2
            exit 1
        fi
        sleep 0.2
    done
}
wait_port "$((base + 31))" "the SuperLink" logs/superlink.log
if [[ $mode == deployment ]]; then
    for i in 0 1; do wait_port "$((base + 41 + i))" "SuperNode $i" "logs/supernode$i.log"; done
fi
federation=()
[[ $mode == simulation ]] && federation=(--federation-config "num-supernodes=2")

result=$here/state/flower-result.json
run_config="num-server-rounds=$rounds spgc-h1='$(at 1)' spgc-h2='$(at 2)'"
run_config+=" spgc-tls-dir='$here/certs' spgc-state-dir='$here/state/providers'"
run_config+=" result-file='$result'"
PATH="$bin:$PATH" "$bin/flwr" run . spgc --stream --run-config "$run_config" "${federation[@]}" >logs/flwr.log 2>&1 || {
    echo "run.sh: flwr run failed (logs/flwr.log):" >&2
    tail -n 20 logs/flwr.log >&2
    exit 1
}
[[ -s $result ]] || {
    echo "run.sh: the ServerApp wrote no result (logs/flwr.log, logs/h1.log):" >&2
    tail -n 20 logs/flwr.log >&2
    exit 1
}
# The servers stop once their last round is published and their ledgers closed.
end=$((SECONDS + 120))
for pid in "${pids[0]}" "${pids[1]}"; do
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < end)) || { echo "run.sh: the SPGC servers did not stop (logs/h1.log)" >&2; exit 1; }
        sleep 0.2
    done
    wait "$pid" || { echo "run.sh: an SPGC server failed (logs/h1.log, logs/h2.log)" >&2; exit 1; }
done
# The Flower app's epsilon, re-accounted from both servers' signed ledgers (spgc account).
"$SPGC" account --ledger state/h1/ledger.jsonl state/h2/ledger.jsonl --json >state/account.json \
    2>logs/account.log || { echo "run.sh: spgc account failed (logs/account.log)" >&2; exit 1; }
"$bin/python" - "$result" state/account.json "$mode" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
account = json.load(open(sys.argv[2]))
out["epsilon_ledgers"] = round(account["epsilon"], 4)
print(json.dumps({"mode": sys.argv[3], **out}))
PY
