#!/usr/bin/env bash
# Runs one example folder (examples/localhost, examples/custom-model, ...): its README's
# commands, in the background: certificates (if missing), H1, H2 and three providers (logs in
# logs/), waits until training is over and prints, as its last line, one JSON object from H1's
# summary: {"rounds": ..., "accuracy": ..., "epsilon": ...}. Exit status 0 only when every
# daemon succeeded. Ctrl-C stops everything it started. Each example's run.sh calls it; an
# example copied elsewhere keeps working with this file in its parent folder (copy examples/
# whole, or the example's folder and this file beside it):
#
#   bash run.sh                         # spgc from SPGC, else PATH, else a .venv above
#   SPGC=/path/to/spgc bash run.sh      # a particular installation
#   SPGC_PORT_BASE=41000 bash run.sh    # ports 41001, 41002, 41011, 41021, 41022 (below)
#   SPGC_TIMEOUT=900 bash run.sh        # seconds before giving up (default 600)
#
#   bash run-example.sh [--dry-run] EXAMPLE_DIR  # --dry-run: print the spgc found and the
#                                                # commands, start nothing
#   bash run-example.sh --which-spgc EXAMPLE_DIR # print the spgc it would run
#
# Which spgc: $SPGC when set; else `spgc` on PATH (an activated venv, a pip install); else the
# first .venv/bin/spgc in the folders above the example (a checkout's own venv).
# Ports: the YAML files' own unless SPGC_PORT_BASE=N is set; then, on 127.0.0.1, H1 listens
# for providers on N+1 and H2 on N+2, H1's data link (gc_address) is N+11, the servers' peer
# ports N+21 (H1) and N+22 (H2), given to every daemon with --set (the YAML files unchanged).
set -euo pipefail
mode=run
case "${1:-}" in
    --dry-run) mode=dry; shift ;;
    --which-spgc) mode=which; shift ;;
esac
[[ $# -eq 1 && -f "$1/h1.yaml" ]] || {
    echo "usage: run-example.sh [--dry-run|--which-spgc] EXAMPLE_DIR" >&2
    exit 2
}
cd "$1"

find_spgc() {  # the spgc to run (see above), or a one-line error
    if [[ -n "${SPGC:-}" ]]; then
        [[ -x "$SPGC" ]] && { echo "$SPGC"; return; }
        echo "run.sh: SPGC=$SPGC is not an executable file" >&2
        return 2
    fi
    if command -v spgc >/dev/null; then
        command -v spgc
        return
    fi
    local dir
    dir=$(pwd -P)
    while true; do
        [[ -x "$dir/.venv/bin/spgc" ]] && { echo "$dir/.venv/bin/spgc"; return; }
        [[ "$dir" == / ]] && break
        dir=$(dirname "$dir")
    done
    echo "run.sh: no spgc found: none on PATH and no .venv/bin/spgc in a folder above" \
        "$(pwd -P); activate the venv of your installation (source REPO/.venv/bin/activate)" \
        "or set SPGC=/path/to/spgc" >&2
    return 2
}
SPGC=$(find_spgc) || exit 2
if [[ $mode == which ]]; then
    echo "$SPGC"
    exit 0
fi
TIMEOUT=${SPGC_TIMEOUT:-600}

# The daemons' ports: the YAML files' (h1.yaml/h2.yaml), or moved by SPGC_PORT_BASE.
h1_sets=() h2_sets=() provider_sets=()
if [[ -n "${SPGC_PORT_BASE:-}" ]]; then
    base=$SPGC_PORT_BASE
    if ! [[ $base =~ ^[0-9]+$ ]] || ((base < 1024 || base > 65535 - 22)); then
        echo "run.sh: SPGC_PORT_BASE=$base: expected a whole number from 1024 to 65513" \
            "(the daemons take ports N+1 to N+22)" >&2
        exit 2
    fi
    at() { echo "127.0.0.1:$((base + $1))"; }
    h1_sets=(--set "listen=$(at 1)" --set "gc_address=$(at 11)"
             --set "peer_listen=$(at 21)" --set "peer_address=$(at 22)")
    h2_sets=(--set "listen=$(at 2)" --set "gc_address=$(at 11)"
             --set "peer_listen=$(at 22)" --set "peer_address=$(at 21)")
    provider_sets=(--set "h1_address=$(at 1)" --set "h2_address=$(at 2)")
    ports="$((base + 1)) $((base + 2)) $((base + 11)) $((base + 21)) $((base + 22))"
else
    ports=$(sed -nE 's/^(listen|peer_listen|gc_address):[[:space:]]*[^#]*:([0-9]+).*/\2/p' \
        h1.yaml h2.yaml | sort -u | tr '\n' ' ')
fi

if [[ $mode == dry ]]; then
    echo "spgc: $SPGC"
    echo "ports: $ports"
    echo "$SPGC server --config h1.yaml ${h1_sets[*]}"
    echo "$SPGC server --config h2.yaml ${h2_sets[*]}"
    for i in 1 2 3; do
        echo "$SPGC provider --config provider$i.yaml ${provider_sets[*]}"
    done
    exit 0
fi

# Only to read the summary's JSON (standard library only).
PYTHON=$(command -v python3 || command -v python || true)
if [[ -z "$PYTHON" ]]; then
    echo "run.sh: python3 is needed to read the summary" >&2
    exit 2
fi

# A daemon already listening on one of the ports (another run of an example?) would make
# ours fail at startup with a less obvious message.
for port in $ports; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "run.sh: port $port on 127.0.0.1 is in use: stop whatever listens there, or" \
            "move the example's ports with SPGC_PORT_BASE=N" >&2
        exit 2
    fi
done

if [[ ! -f certs/ca.pem ]]; then
    "$SPGC" certs certs --names h1 h2 --providers p1 p2 p3 >/dev/null
fi
# The servers' YAML sets resume: false, so old state is simply replaced; only a stale summary
# must go, or a failed run could report the previous run's figures.
rm -f state/h1-summary.json state/h2-summary.json
mkdir -p logs

names=(h1 h2 p1 p2 p3)
declare -A pids=()

cleanup() {
    local name pid
    trap - EXIT INT TERM
    if ((${#pids[@]})); then
        echo "run.sh: stopping ${!pids[*]}" >&2
    fi
    for name in "${!pids[@]}"; do
        kill -TERM "${pids[$name]}" 2>/dev/null || true
    done
    # Time to stop cleanly (a server in the middle of a circuit takes a few seconds), then
    # SIGKILL: no daemon is left behind.
    for _ in $(seq 100); do
        local alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
    pids=()
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

fail() {  # fail NAME MESSAGE: show the tail of NAME's log, exit 1 (the trap stops the rest)
    echo "run.sh: $2" >&2
    echo "--- last lines of logs/$1.log" >&2
    tail -n 20 "logs/$1.log" >&2 || true
    exit 1
}

# The README's commands, one per terminal there.
"$SPGC" server --config h1.yaml "${h1_sets[@]}" >logs/h1.log 2>&1 &
pids[h1]=$!
"$SPGC" server --config h2.yaml "${h2_sets[@]}" >logs/h2.log 2>&1 &
pids[h2]=$!
for i in 1 2 3; do
    "$SPGC" provider --config "provider$i.yaml" "${provider_sets[@]}" >"logs/p$i.log" 2>&1 &
    pids[p$i]=$!
done
echo "run.sh: started H1, H2 and 3 providers (logs in $(pwd)/logs); training..." >&2

# Wait for every daemon; the servers exit by themselves once training is over. A server that
# fails ends the run at once, and so does a provider that fails while training goes on. A
# provider that fails (status 1) just as the servers shut down (its last status poll can meet
# a server that is stopping) is only a warning: training was over, the summary is complete.
# H1's round lines are echoed as progress.
training_over() { grep -qs '"finished": true' state/h1-summary.json; }
GRACE=15  # seconds for H1's summary to appear, or for providers to leave, once training ends
start=$SECONDS
shown=0
servers_done=""
declare -A status=() failed_at=()
while true; do
    for name in "${names[@]}"; do
        [[ -n "${status[$name]:-}" ]] && continue
        kill -0 "${pids[$name]}" 2>/dev/null && continue
        rc=0
        wait "${pids[$name]}" || rc=$?
        status[$name]=$rc
        unset "pids[$name]"
        if ((rc != 0)); then
            # Servers, and a provider's configuration error (2) or refusal (3): fail now.
            [[ $name == h* || $rc != 1 ]] && fail "$name" "$name exited with status $rc"
            failed_at[$name]=$SECONDS
        fi
    done
    for name in "${!failed_at[@]}"; do
        if training_over; then
            echo "run.sh: warning: $name exited with status ${status[$name]} after training" \
                "finished (see logs/$name.log)" >&2
            unset "failed_at[$name]"
        elif ((SECONDS - failed_at[$name] > GRACE)); then
            fail "$name" "$name exited with status ${status[$name]}"
        fi
    done
    lines=$(wc -l <logs/h1.log)
    if ((lines > shown)); then
        sed -n "$((shown + 1)),${lines}p" logs/h1.log | grep -E ' round [0-9]+' >&2 || true
        shown=$lines
    fi
    if [[ -n "${status[h1]:-}" && -n "${status[h2]:-}" ]]; then
        servers_done=${servers_done:-$SECONDS}
        if ((${#status[@]} == ${#names[@]} && ${#failed_at[@]} == 0)); then
            break
        fi
        if ((SECONDS - servers_done > GRACE)) && ((${#failed_at[@]} == 0)); then
            for name in "${!pids[@]}"; do
                echo "run.sh: warning: $name still running after training finished: stopping it" >&2
            done
            break  # the EXIT trap stops them
        fi
    fi
    if ((SECONDS - start > TIMEOUT)); then
        fail h1 "training did not finish within $TIMEOUT s (SPGC_TIMEOUT)"
    fi
    sleep 0.5
done

[[ -f state/h1-summary.json ]] || fail h1 "H1 wrote no summary (state/h1-summary.json)"
# Exit status of each provider ("stopped": still running after training, stopped above).
exits=()
for name in p1 p2 p3; do
    exits+=("$name=${status[$name]:-stopped}")
done
"$PYTHON" - state/h1-summary.json "${exits[@]}" <<'EOF' || fail h1 "H1's summary reports no finished run"
import json
import sys

s = json.load(open(sys.argv[1]))
if s.get("failure") or not s.get("finished"):
    print(f"run.sh: H1's summary: finished={s.get('finished')} failure={s.get('failure')}",
          file=sys.stderr)
    sys.exit(1)
print(json.dumps({
    "rounds": s["rounds"],
    "steps": s["steps"],
    "accuracy": s["test_accuracy"],
    "loss": s["test_loss"],
    "epsilon": s["epsilon"],
    "delta": s["delta"],
    "gc_bytes": s["gc_bytes"],
    "run_id": s["run_id"],
    "provider_exit": {k: int(v) if v.isdigit() else v for k, v in
                      (a.split("=", 1) for a in sys.argv[2:])},
}))
EOF
