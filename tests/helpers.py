"""Helpers shared by the tests: a throwaway PKI, background threads, a two-party harness."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from garbled_core import Channel, Evaluator, Garbler, Listener, TlsConfig
from spgc.app import cli
from spgc.protocol.certs import make_dev_pki
from spgc.settings.config import ServerConfig

#: The tests' root (this folder) and the checkout's root.
TESTS_ROOT = Path(__file__).resolve().parent
REPO_ROOT = TESTS_ROOT.parent
#: The folders the tests sit in, by layer (engine/, library/<subpackage>/, servers/, providers/,
#: app/, e2e/) and this one: on sys.path (conftest.py), so that a test module may import another's
#: fixtures by its name wherever either sits.
TEST_DIRS = [TESTS_ROOT, *sorted({p.parent for p in TESTS_ROOT.glob("*/**/test_*.py")})]


def make_test_pki(directory: Path) -> dict[str, Any]:
    """h1, h2 and 'ca' from one development CA; 'other:h1', 'other:h2' and 'other_ca'
    from an unrelated one. Names map to (cert, key) paths, CAs to their cert path."""
    pki: dict[str, Any] = {}
    for prefix, sub in (("", "good"), ("other:", "other")):
        made = make_dev_pki(directory / sub, ["h1", "h2"])
        for name, paths in made.items():
            pki[prefix + name] = (str(paths.cert), str(paths.key))
        pki["other_ca" if prefix else "ca"] = str(made["h1"].ca)
    return pki


def tls_config(pki: dict[str, Any], name: str, ca: str = "ca") -> TlsConfig:
    cert, key = pki[name]
    return TlsConfig(cert, key, pki[ca])


class Background:
    """Runs fn in a thread; result() re-raises its exception in the caller."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as e:
            self.error = e

    def result(self, timeout: float = 60.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background side hung"
        if self.error is not None:
            raise self.error
        return self.value


class TwoParty:
    """A garbler and an evaluator session in one process, linked over loopback.

    The engine releases the GIL, so the two sides run concurrently in threads.
    """

    def __init__(self, tls: tuple[TlsConfig, TlsConfig] | None = None, **session_kw: Any) -> None:
        listener = Listener("127.0.0.1", 0)
        kw_g = {"tls": tls[0]} if tls else {"insecure": True}
        kw_e = {"tls": tls[1]} if tls else {"insecure": True}
        accepting = Background(lambda: listener.accept(timeout=10, **kw_g))
        self.evaluator_channel = Channel.connect("127.0.0.1", listener.port, timeout=10, **kw_e)
        self.garbler_channel = accepting.result()
        listener.close()
        self.garbler = Garbler(self.garbler_channel, **session_kw)
        self.evaluator = Evaluator(self.evaluator_channel, **session_kw)

    def run(
        self,
        circuit: Any,
        garbler_inputs: dict | None = None,
        evaluator_inputs: dict | None = None,
        garbler_carried: dict | None = None,
        evaluator_carried: dict | None = None,
        n: int | None = None,
    ) -> tuple[dict, dict]:
        """Runs both halves at once; returns (garbler's outputs, evaluator's outputs)."""
        side = Background(
            lambda: self.garbler.run(circuit, garbler_inputs or {}, garbler_carried or {}, n)
        )
        out_e = self.evaluator.run(circuit, evaluator_inputs or {}, evaluator_carried or {}, n)
        return side.result(), out_e

    def close(self) -> None:
        self.garbler_channel.close()
        self.evaluator_channel.close()


def proto_descriptors_with_comments(tmp_path: Path) -> Any:
    """The .proto files compiled with their comments (a FileDescriptorSet with source info);
    skips the test without grpcio-tools (a test requirement)."""
    import pytest

    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test requirement) is missing")
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    from spgc.wire import codegen

    root = Path(__file__).resolve().parents[1] / "proto"
    out = tmp_path / "with-source-info.pb"
    include = Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{root}", f"-I{include}", "--include_source_info"]
    assert protoc.main([*args, f"--descriptor_set_out={out}", *codegen.PROTO_FILES]) == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def wait_until(condition: Any, what: str, timeout: float = 20.0) -> None:
    """Poll ``condition()`` until it holds: a test waits on what it needs to have happened,
    never on a fixed sleep that a loaded (or a quiet) machine can beat. AssertionError naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def loopback_server_config(**changes: object) -> ServerConfig:
    """A plaintext one-round server configuration on ephemeral loopback ports, for tests of
    the configuration and the plan; ``changes`` override its keys."""
    base: dict[str, object] = {
        "insecure": True,
        "providers": ["p1", "p2"],
        "listen": "127.0.0.1:0",
        "peer_listen": "127.0.0.1:0",
        "gc_address": "127.0.0.1:0",
        "rounds": 1,
    }
    return ServerConfig(**{**base, **changes})


def run_in_process(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``spgc ARGS`` through cli.main in this process (no interpreter start-up, no imports):
    the exit status and output of the command, for commands that only check and print. Tests
    of start-up itself (logging, console scripts, the launcher) run the real command."""
    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(argv))
            except SystemExit as exc:  # argparse's own exits
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["spgc", *argv], rc, out.getvalue(), err.getvalue())
