#!/usr/bin/env python3
"""Regenerate (or check) the committed gRPC modules in spgc/wire/_generated/ from proto/.

    python scripts/gen_proto.py            # regenerate
    python scripts/gen_proto.py --check    # exit 1 when the committed modules are stale

Needs grpcio-tools at the pinned version (spgc.wire.codegen.GRPCIO_TOOLS_VERSION); another
version is refused unless --any-version, since it changes the generated code and the protobuf
and grpcio runtimes it demands.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _load_codegen() -> ModuleType:
    """The checkout's spgc/wire/codegen.py, loaded by path: importing the package spgc.wire
    would import the generated modules, which may be missing or stale right now."""
    path = ROOT / "spgc" / "wire" / "codegen.py"
    spec = importlib.util.spec_from_file_location("_spgc_codegen", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


codegen = _load_codegen()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    parser.add_argument(
        "--any-version",
        action="store_true",
        help="run with a grpcio-tools version other than the pinned one",
    )
    args = parser.parse_args(argv)

    have = codegen.installed_generator_version()
    want = codegen.GRPCIO_TOOLS_VERSION
    if have is None:
        print(f"grpcio-tools is not installed: pip install grpcio-tools=={want}", file=sys.stderr)
        return 2
    if have != want and not args.any_version:
        print(
            f"grpcio-tools {have} is installed; the committed code is made with {want} "
            f"(pip install grpcio-tools=={want}, or pass --any-version and update the pin)",
            file=sys.stderr,
        )
        return 2

    files = codegen.generate(ROOT / "proto")
    target = ROOT / codegen.GENERATED_DIR
    problems = codegen.compare(files, target)
    if args.check:
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("generated code is stale: run python scripts/gen_proto.py", file=sys.stderr)
            return 1
        print(f"{target}: in sync with proto/")
        return 0
    if problems:
        codegen.write(files, target)
        print(f"{target}: regenerated ({len(problems)} file(s) changed)")
    else:
        print(f"{target}: already in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
