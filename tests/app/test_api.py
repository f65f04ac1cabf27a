"""spgc.app.api: docs/API.md's snippets run as written, and failures are clear errors."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import REPO_ROOT, loopback_server_config

from spgc.app.api import finish_server, run_provider, run_server, start_server
from spgc.app.demo import free_ports
from spgc.protocol.certs import make_dev_pki

ROOT = REPO_ROOT
DOC = ROOT / "docs" / "API.md"


def python_blocks() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) == 2, "docs/API.md: the one-process run and the YAML example"
    return blocks


def run_snippet(code: str, tmp_path: Path, timeout: float, cwd: Path = ROOT) -> str:
    """Runs ``code`` as a script in a fresh interpreter, from the repository root (where the
    doc says to run it); the script sits in tmp_path so the installed spgc is imported, not
    the checkout's sources."""
    script = tmp_path / "snippet.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"snippet failed:\n{done.stderr[-4000:]}"
    return done.stdout


def test_doc_snippet_runs_both_servers_and_three_providers(tmp_path: Path) -> None:
    # The doc's ports (50251, ...) lie in the range the kernel gives outgoing connections, where
    # a test on another pytest-xdist worker may hold one: the run uses ports free now instead.
    code = python_blocks()[0]
    ports = sorted({int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", code)})
    for old, new in zip(ports, free_ports(len(ports)), strict=True):
        code = code.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    out = run_snippet(code, tmp_path, timeout=300)
    values = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert values["rounds"] == "3"
    assert values["provider rounds"] == "[3, 3, 3]"
    assert 0.8 <= float(values["test accuracy"]) <= 1.0  # cancer after 3 noisy steps
    eps = float(values["epsilon"].split()[0])
    assert 0 < eps <= 4.0
    assert "(delta 1e-05)" in values["epsilon"]


def test_doc_snippet_loads_yaml(tmp_path: Path) -> None:
    # Where the doc says to run it: a copy of examples/localhost with its certificates.
    work = tmp_path / "localhost"
    shutil.copytree(ROOT / "examples" / "localhost", work, ignore=shutil.ignore_patterns("certs"))
    make_dev_pki(work / "certs", ["h1", "h2", "p1", "p2", "p3"])
    out = run_snippet(python_blocks()[1], tmp_path, timeout=60, cwd=work).strip().splitlines()
    assert out[0] == "h1 on 127.0.0.1:50151: 3 rounds, target epsilon 4"
    assert out[1].startswith("refused: ") and "rounds" in out[1] and ">= 1" in out[1]


def test_run_server_refuses_what_cannot_start() -> None:
    # precompute fills the noise pool of mode preprocessed only
    with pytest.raises(RuntimeError, match=r"^h1 could not start: .*mode is spgc"):
        run_server(loopback_server_config(), precompute=0)
    with pytest.raises(TypeError, match="ServerConfig"):
        run_server({"role": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ProviderConfig"):
        run_provider(loopback_server_config())  # type: ignore[arg-type]


@contextmanager
def silent_port() -> Iterator[int]:
    """A local port that is bound but never listens: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_run_server_reports_a_failed_daemon() -> None:
    # H1 whose H2 never answers: the daemon gives up after connect_timeout, and run_server
    # says which server failed and why, in one line (no gRPC debug dump).
    with silent_port() as port:
        cfg = loopback_server_config(peer_address=f"127.0.0.1:{port}", connect_timeout=1.0)
        failed = r"^h1 failed: h2 did not answer the Handshake at .*: UNAVAILABLE"
        with pytest.raises(RuntimeError, match=failed) as info:
            run_server(cfg)
    assert "\n" not in str(info.value)


def test_finish_server_stops_the_daemon_on_timeout_and_ctrl_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # H2 waiting for an H1 that never comes
    daemon = start_server(loopback_server_config(role=2, peer_name="h1", connect_timeout=30.0))
    with pytest.raises(RuntimeError, match=r"^h2 did not finish within 0.5 s"):
        finish_server(daemon, timeout=0.5)
    assert daemon.stop_event.is_set()

    daemon = start_server(loopback_server_config(role=2, peer_name="h1", connect_timeout=30.0))

    def interrupted(timeout: float | None = None) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(daemon, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finish_server(daemon)
    assert daemon.stop_event.is_set()
    assert daemon.done.wait(10)  # its thread ended: nothing left running
