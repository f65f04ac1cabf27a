"""The console scripts: Ctrl-C while a command still imports ends it in one line."""

from __future__ import annotations

import signal
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import spgc.app.launch as launch

# SIGINT as spgc.app.launch starts its slow imports (torch, gRPC: seconds): an import hook
# sends it when spgc.app.cli, the first of them, is looked up. Not after a fixed delay,
# which a quick import could beat and a slow start could make land before the handler.
INTERRUPT_WHILE_IMPORTING = (
    "import os, signal, sys\n"
    "sys.argv[0] = 'spgc'\n"
    "class InterruptTheSlowImports:\n"
    "    @staticmethod\n"
    "    def find_spec(name, path=None, target=None):\n"
    "        if name == 'spgc.app.cli':\n"
    "            os.kill(os.getpid(), signal.SIGINT)\n"
    "        return None\n"
    "sys.meta_path.insert(0, InterruptTheSlowImports)\n"
    "{ignore}"
    "import spgc.app.launch\n"
    "print('imported', signal.getsignal(signal.SIGINT))\n"
)


def _run(ignore: str) -> subprocess.CompletedProcess[str]:
    code = INTERRUPT_WHILE_IMPORTING.format(ignore=ignore)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_ctrl_c_while_importing_is_one_line_and_exit_130() -> None:
    done = _run("")
    assert (done.returncode, done.stdout) == (130, "")
    assert done.stderr == "spgc: interrupted\n"


def test_an_ignored_sigint_stays_ignored() -> None:
    done = _run("signal.signal(signal.SIGINT, signal.SIG_IGN)\n")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"imported {signal.SIG_IGN}\n"


def test_the_commands_start_with_pythons_own_handler() -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert callable(launch.spgc) and callable(launch.spgc_server)


@pytest.mark.parametrize("script", ["spgc", "spgc-server", "spgc-provider"])
def test_console_scripts_point_at_the_launcher(script: str) -> None:
    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == script]
    assert entry.module == "spgc.app.launch"
