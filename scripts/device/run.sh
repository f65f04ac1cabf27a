#!/usr/bin/env bash
# The 16-core checks of issues 15 and 17, as one call on the device machine (which reaches no
# network and lends 15 minutes in all, its start included). Here first:
#
#   bash scripts/device/pack.sh
#
# then the device tool: run(command="bash scripts/device/run.sh", carry=[".device"],
# timeout_s=560). It installs the packed wheels and Ray under /tmp, builds SPGC with every core,
# and runs, most important first, each under what is left of a time budget (a step that would
# not fit is skipped and says so):
#
#   1. spgc bench gc --insecure --threads 1,2,4,8 --repeat 3   issue 15: T=4 >= 3x, T=8 >= 5x
#   2. spgc bench scale --dim 1000000 --workers 1, then 8        issue 17: K=8 >= 5x K=1
#   3. spgc bench scale --mode preprocessed --dim 1000000 --workers 1, 2, 4, 8   pool vs K
#   4. spgc bench scale --mode preprocessed --dim 10000000 --workers 8   online round <= 60 s
#   5. spgc bench gc --tls-only --threads 1,2,4,8 --repeat 3      the same lanes over TLS
#   6. spgc demo --rounds 3 --keep   providers on the GPU (device: auto), end to end
#
# Two files land in $OUT (the device tool brings back at most 8): summary.txt, which the end of
# the output repeats, and results.tar.gz (each step's JSON and log, the machine's description,
# the build log), refreshed after every step so that a call cut short still brings back the
# steps it finished. SPGC_DEVICE_QUICK=1 runs the same steps at small sizes (a rehearsal on any
# machine with Python 3.12 and the device image's packages); SPGC_DEVICE_BUDGET_S sets the
# budget (default 500 s). SPGC_DEVICE_STEPS names the steps to run (default all of them, in
# the order above: gc_plain scale pool online_10m gc_tls demo_gpu) and SPGC_DEVICE_GC_REPEAT the
# gc steps' --repeat (default 3): a second call re-measures only what a first one missed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-/tmp/spgc-device-out}"
SITE="${SPGC_DEVICE_SITE:-/tmp/spgc-device-site}"
PY="${PYTHON:-python3}"
QUICK="${SPGC_DEVICE_QUICK:-0}"
BUDGET="${SPGC_DEVICE_BUDGET_S:-500}"
START=$SECONDS
WORK="$(mktemp -d /tmp/spgc-device-results.XXXXXX)"
mkdir -p "$OUT"

say() { printf '[device %4ds] %s\n' "$((SECONDS - START))" "$*" | tee -a "$OUT/summary.txt" >&2; }
bundle() { tar -C "$WORK" -czf "$OUT/results.tar.gz" . ; }
die() { say "error: $*"; bundle; exit 1; }

[[ -d "$ROOT/.device/wheels" && -f "$ROOT/.device/ray-site.tar.xz" ]] \
    || die "no .device/ pack: run bash scripts/device/pack.sh here and carry [\".device\"]"

packed_for="$(cat "$ROOT/.device/python-version" 2>/dev/null)"
here="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"
[[ "$packed_for" == "$here" ]] || die "the pack's wheels are for Python ${packed_for:-?}, \
$PY here is ${here:-missing}: SPGC_DEVICE_PYTHON=$here bash scripts/device/pack.sh"

# ---------------------------------------------------------------- install and build
say "installing the packed wheels and Ray into $SITE"
rm -rf "$SITE"
mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$ROOT"/.device/wheels/*.whl >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log" >&2; die "wheel install failed"; }
tar -xJf "$ROOT/.device/ray-site.tar.xz" -C "$SITE" || die "unpacking Ray failed"
export PYTHONPATH="$SITE"

# OpenSSL's headers, from the pack where the image has none; the image's own runtime libraries.
cmake_defs=()
have_ssl_headers() {
    printf '#include <openssl/ssl.h>\nint main(){return 0;}\n' \
        | "${CXX:-c++}" -x c++ -std=c++17 -fsyntax-only "$@" - >/dev/null 2>&1
}
if [[ "${SPGC_DEVICE_PACKED_SSL:-0}" == 1 ]] || ! have_ssl_headers; then
    ssl_dir="$(mktemp -d)"
    tar -xzf "$ROOT/.device/openssl-headers.tar.gz" -C "$ssl_dir" || die "no packed OpenSSL headers"
    lib() { ldconfig -p | sed -n "s|.*$1 (libc6,x86-64) => ||p" | head -1; }
    ssl_lib="$(lib libssl.so.3)"
    crypto_lib="$(lib libcrypto.so.3)"
    [[ -n "$ssl_lib" && -n "$crypto_lib" ]] || die "no OpenSSL 3 runtime (libssl.so.3, libcrypto.so.3)"
    have_ssl_headers -I"$ssl_dir/include" || die "the packed OpenSSL headers do not compile here"
    cmake_defs=(
        -C "cmake.define.OPENSSL_INCLUDE_DIR=$ssl_dir/include"
        -C "cmake.define.OPENSSL_SSL_LIBRARY=$ssl_lib"
        -C "cmake.define.OPENSSL_CRYPTO_LIBRARY=$crypto_lib"
    )
    say "OpenSSL: the packed headers with $ssl_lib"
fi

say "building SPGC (the engine with $(nproc) jobs)"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
(cd "$ROOT" && "$PY" -m pip install --no-index --no-deps --no-build-isolation --no-compile \
    "${cmake_defs[@]}" --target "$SITE" .) >"$WORK/build.log" 2>&1 \
    || { tail -n 40 "$WORK/build.log" >&2; die "build failed"; }
# The module, not $SITE/bin/spgc: --target leaves bin/ as the first wheel with scripts made it.
SPGC=("$PY" -m spgc.app.cli)

# The benchmarks run outside the checkout so that nothing imports its source tree.
RUN_DIR="$(mktemp -d)"
cd "$RUN_DIR"
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "tree: $(cat "$ROOT/.device/commit" 2>/dev/null || echo unknown)"
    echo "cpus: $(nproc); $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')"
    echo "threads per core: $(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p')"
    echo "memory: $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB"}')"
    echo "python: $("$PY" -V 2>&1); $(openssl version 2>/dev/null)"
    "$PY" -c 'import garbled_core, spgc, ray, numpy, torch; print("spgc", spgc.__version__, "from",
        spgc.__file__, "| ray", ray.__version__, "| numpy", numpy.__version__, "| torch",
        torch.__version__, "cuda", torch.cuda.is_available())'
} >"$WORK/machine.txt" 2>&1 || { cat "$WORK/machine.txt" >&2; die "the installed SPGC does not import"; }
cat "$WORK/machine.txt" >>"$OUT/summary.txt"
cat "$WORK/machine.txt" >&2

# ---------------------------------------------------------------- the steps
if [[ "$QUICK" == 1 ]]; then
    GC_INSTANCES=100000; GC_THREADS=1,2; GC_REPEAT=1
    DIM=40000; K_BIG=2; POOL_KS="1 2"; DIM_ONLINE=100000; K_ONLINE=2
else
    GC_INSTANCES=4000000; GC_THREADS=1,2,4,8; GC_REPEAT=3
    DIM=1000000; K_BIG=8; POOL_KS="1 2 4 8"; DIM_ONLINE=10000000; K_ONLINE=8
fi

STEPS="${SPGC_DEVICE_STEPS:-gc_plain scale pool online_10m gc_tls demo_gpu}"
GC_REPEAT="${SPGC_DEVICE_GC_REPEAT:-$GC_REPEAT}"
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

# step NAME MAX_SECONDS ARGS...: one spgc command under min(MAX, what is left of the budget),
# its JSON to NAME.json and its log to NAME.log in the results.
step() {
    local name="$1" max="$2" left
    shift 2
    left=$((BUDGET - (SECONDS - START) - 5))
    if ((left < 30)); then
        say "$name: skipped, ${left} s left of the budget"
        return 0
    fi
    ((max < left)) || max=$left
    say "$name: spgc $* (at most ${max} s)"
    timeout --signal=INT --kill-after=10 "$max" "${SPGC[@]}" "$@" --json \
        >"$WORK/$name.json" 2>"$WORK/$name.log"
    local rc=$?
    # A step cut short can leave its Ray cluster or its party processes behind; they would take
    # cores from the next step. (A finished step has ended its own.)
    if ((rc != 0)); then
        pkill -9 -f "$SITE/ray/" 2>/dev/null
        pkill -9 -f "ray::" 2>/dev/null
        pkill -9 -f "multiprocessing.spawn" 2>/dev/null
        if ((rc == 124)); then say "$name: timed out at ${max} s; the end of its log:"
        else say "$name: exit $rc; the end of its log:"; fi
        tail -n 5 "$WORK/$name.log" | tee -a "$OUT/summary.txt" >&2
    fi
    bundle
}

if wanted gc_plain; then
    step gc_plain 150 bench gc --insecure --threads "$GC_THREADS" --repeat "$GC_REPEAT" \
        --instances "$GC_INSTANCES"
fi
if wanted scale; then
    step scale_k1 120 bench scale --dim "$DIM" --workers 1 --model
    step "scale_k$K_BIG" 90 bench scale --dim "$DIM" --workers "$K_BIG"
fi
if wanted pool; then
    for k in $POOL_KS; do
        step "pool_k$k" 90 bench scale --mode preprocessed --dim "$DIM" --workers "$k"
    done
fi
if wanted online_10m; then
    step online_10m 150 bench scale --mode preprocessed --dim "$DIM_ONLINE" --workers "$K_ONLINE"
fi
if wanted gc_tls; then
    step gc_tls 150 bench gc --tls-only --threads "$GC_THREADS" --repeat "$GC_REPEAT" \
        --instances "$GC_INSTANCES"
fi
if wanted demo_gpu; then
    step demo_gpu 90 demo --rounds 3 --keep
    kept="$(sed -n 's/^demo files kept in //p' "$WORK/demo_gpu.log" 2>/dev/null | tail -1)"
    if [[ -n "$kept" && -d "$kept" ]]; then  # where each provider computed its gradients
        grep -ho "joined run .*gradients on [a-z]*" "$kept"/*.log >"$WORK/demo_devices.txt" 2>/dev/null
        sed 's/^/   provider /; s/joined run [^:]*: .*gradients on/gradients on/' \
            "$WORK/demo_devices.txt" | tee -a "$OUT/summary.txt" >&2
        bundle
    fi
fi

# ---------------------------------------------------------------- the summary
WORK="$WORK" K_BIG="$K_BIG" "$PY" - <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, os, pathlib

out = pathlib.Path(os.environ["WORK"])


def load(name):
    try:
        return json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


for name in ("gc_plain", "gc_tls"):
    log = out / f"{name}.log"
    if load(name) is not None and log.exists():
        lines = log.read_text().splitlines()
        table = [i for i, line in enumerate(lines) if line.startswith("scheme")]
        print(f"== {name} (the benchmark's table)")
        print("\n".join(lines[table[0] if table else 0:]))
k1, kb = load("scale_k1"), load(f"scale_k{os.environ['K_BIG']}")
for r in (k1, kb):
    if r:
        print(f"== spgc round, {r['dim']:,} coordinates, K = {r['workers']}: "
              f"{r['seconds_per_round']:.2f} s, {r['and_gates_per_second'] / 1e6:.1f} M AND/s, "
              f"correct {r['correct']}")
if k1 and kb:
    print(f"   K = {kb['workers']} over K = 1: {k1['seconds_per_round'] / kb['seconds_per_round']:.2f}x")
pools = [p for p in (load(f"pool_k{k}") for k in (1, 2, 4, 8)) if p]
for p in pools:
    print(f"== pool production, {p['dim']:,} samples, K = {p['workers']}: "
          f"{p['samples_per_second']:,.0f} samples/s "
          f"({p['samples_per_second'] / pools[0]['samples_per_second']:.2f}x K = "
          f"{pools[0]['workers']}), correct {p['correct']}")
demo = load("demo_gpu")
if demo:
    keys = ("finished", "rounds", "test_accuracy", "epsilon", "gc_bytes", "seconds")
    print(f"== spgc demo (providers with device: auto): {({k: demo.get(k) for k in keys})}")
o = load("online_10m")
if o:
    print(f"== preprocessed, {o['dim']:,} coordinates, K = {o['workers']}: offline "
          f"{o['offline_seconds']:.1f} s, online round {o['online_seconds_per_round']:.2f} s, "
          f"correct {o['correct']}")
EOF
bundle
say "done: $OUT/summary.txt and $OUT/results.tar.gz"
