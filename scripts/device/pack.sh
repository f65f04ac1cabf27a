#!/usr/bin/env bash
# Pack what the 16-core device machine lacks into .device/ (ignored by git), for
# scripts/device/run.sh there. Run here, once per session, before the device call:
#
#   bash scripts/device/pack.sh          # then: run(command="bash scripts/device/run.sh",
#                                        #           carry=[".device"], timeout_s=560)
#
# Why a pack: the device machine reaches no network, and a call carries at most 64 MiB (the
# working tree included). Its image (Python 3.12) has numpy, scipy, torch, cmake, pybind11 and
# scikit-build-core but not cryptography, pydantic, dp-accounting, grpcio-health-checking nor
# Ray; Ray's wheel alone is about 79 MB. So the pure wheels travel as they are and Ray travels
# unpacked without the parts SPGC never loads (Java jars, RLlib, Serve, Data, Train, Tune, LLM),
# recompressed with xz: about 30 MB. Versions are the ones installed in .venv (what the tests
# ran), so the device runs the same set.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV="${SPGC_VENV:-$ROOT/.venv}"
PYVER="${SPGC_DEVICE_PYTHON:-3.12}"   # the device image's Python
DEST="$ROOT/.device"
LIMIT_MIB=64

say() { printf '[device-pack] %s\n' "$*" >&2; }
die() { printf '[device-pack] error: %s\n' "$*" >&2; exit 1; }

[[ -x "$VENV/bin/python" ]] || die "no $VENV: run bash scripts/setup.sh first (the pack takes its versions)"

# What the image lacks, or holds at versions the generated gRPC code or pydantic refuse. Each
# is pinned to the version .venv holds.
packages=(
    cryptography cffi pycparser
    pydantic pydantic_core annotated-types typing-inspection typing_extensions
    dp-accounting dm-tree attrs
    grpcio grpcio-health-checking protobuf
    jsonschema jsonschema-specifications referencing rpds-py  # Ray's needs missing there
)
pins=()
for name in "${packages[@]}"; do
    version="$("$VENV/bin/python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')"
    [[ -n "$version" ]] || die "$name is not installed in $VENV"
    pins+=("$name==$version")
done
ray_version="$("$VENV/bin/python" -m pip show ray 2>/dev/null | sed -n 's/^Version: //p')"
[[ -n "$ray_version" ]] || die "ray is not installed in $VENV (scripts/setup.sh installs it)"

rm -rf "$DEST"
mkdir -p "$DEST/wheels"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
download() {
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "$PYVER" --implementation cp "${platforms[@]}" -d "$1" "${@:2}" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
say "downloading ${#pins[@]} wheels for CPython $PYVER: ${pins[*]}"
download "$DEST/wheels" "${pins[@]}"

say "downloading ray==$ray_version and packing the parts SPGC loads"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
download "$tmp" "ray==$ray_version"
mkdir "$tmp/site"
command -v unzip >/dev/null || die "unzip is needed (it keeps the executables' modes Ray's raylet needs)"
unzip -q "$tmp"/ray-*.whl -d "$tmp/site"
rm -rf "$tmp"/site/ray/{jars,rllib,serve,llm,tune,train,data}
# The console scripts pip would write are not needed: SPGC starts Ray with ray.init.
tar -C "$tmp/site" -cf - . | xz -T0 -6 >"$DEST/ray-site.tar.xz"

# The engine compiles against OpenSSL 3's headers. The device image is not known to hold them
# (it has the runtime libraries); run.sh unpacks these only where they are missing.
# include_dir H: the directory the compiler finds openssl/H in (Debian puts configuration.h
# in an arch-specific one).
include_dir() {
    printf '#include <openssl/%s>\n' "$1" | "${CXX:-c++}" -x c++ -E - 2>/dev/null \
        | sed -n "s|^# [0-9]* \"\(.*\)/openssl/$1\".*|\1|p" | head -1
}
ssl_include="$(include_dir ssl.h)"
[[ -n "$ssl_include" ]] || die "no OpenSSL headers here to pack (apt-get install libssl-dev)"
ssl_dirs=("$ssl_include/openssl")
conf="$(include_dir configuration.h)"
[[ -n "$conf" && "$conf" != "$ssl_include" ]] && ssl_dirs+=("$conf/openssl")
mkdir -p "$tmp/ssl/include/openssl"
for dir in "${ssl_dirs[@]}"; do cp -r "$dir"/. "$tmp/ssl/include/openssl/"; done
tar -C "$tmp/ssl" -czf "$DEST/openssl-headers.tar.gz" include

# The device gets the working tree without .git: say which tree it is.
dirty=""
[[ -z "$(git status --porcelain --untracked-files=no)" ]] || dirty=" with uncommitted changes"
echo "commit $(git rev-parse --short HEAD)$dirty, packed $(date -u '+%Y-%m-%d %H:%M UTC')" >"$DEST/commit"
echo "$PYVER" >"$DEST/python-version"

wheels_mib=$(du -sm "$DEST" | cut -f1)
tree_mib=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
    | awk '{ s += $1 } END { print int(s / 1048576) + 1 }')
total=$((wheels_mib + tree_mib))
say "packed $(ls "$DEST/wheels" | wc -l) wheels and Ray in $DEST: ${wheels_mib} MiB, the tracked tree ${tree_mib} MiB"
((total < LIMIT_MIB)) || die "${total} MiB would travel, over the call's ${LIMIT_MIB} MiB"
say "ready: carry [\".device\"] and run: bash scripts/device/run.sh"
