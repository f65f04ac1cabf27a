"""``spgc provider --config provider.yaml [--set key=value ...]``: run one provider.

The same command as ``spgc-provider`` and ``python -m spgc.providers``. Exit status: 0 when
training finished (or ``max_rounds`` were done), 2 for a configuration error (a key or value,
or, found at the start before any server is called, a model or data the provider cannot use:
what ``spgc config check`` finds), 3 when the provider refused to take part (the message says
why), 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import grpc

from spgc.common.logs import (
    interrupted_status,
    print_error,
    setup_logging,
    stop_like_ctrl_c_on_sigterm,
)
from spgc.common.progress import Progress, terminal_logging
from spgc.learning.data import DATA_ERRORS
from spgc.providers.client import (
    ModelFailed,
    ProviderClient,
    ProviderRefusal,
    RoundReport,
    RunFailed,
    SelfCheckFailed,
)
from spgc.settings.config import ConfigError
from spgc.settings.config_files import add_daemon_arguments, load_provider_config

PROG = "spgc provider"
log = logging.getLogger("spgc.provider")


def build_parser() -> argparse.ArgumentParser:
    """The provider's options: the config file and ``--set`` for any key."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run one SPGC provider (also `spgc-provider`): fetch the servers' plan, "
        "accept or refuse it, and share clipped, fixed-point gradient sums each round. Every "
        "configuration key is in `spgc config show provider` and docs/CONFIG.md.",
    )
    add_daemon_arguments(p, "--set provider_index=1")
    p.add_argument("--verbose", "-v", action="store_true", help="same as --log-level debug")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    level = "debug" if args.verbose else args.log_level
    try:
        cfg = load_provider_config(
            args.config, args.overrides, log_level=level, log_format=args.log_format
        )
    except ConfigError as exc:
        print_error(PROG, f"configuration error: {exc}", argv)
        return 2
    setup_logging(cfg.log_level, cfg.log_format)
    stop_like_ctrl_c_on_sigterm()
    shown: dict[str, Progress] = {}
    try:
        with ProviderClient(cfg) as client:

            def show(report: RoundReport | None) -> None:
                """On a terminal, a progress line: rounds of the plan, privacy, last time."""
                if "bar" not in shown:
                    total = client.training.max_rounds if client.training is not None else 0
                    # Not a terminal: the per-round log lines say the same.
                    shown["bar"] = Progress(total or None, "rounds", desc=cfg.name, lines=False)
                done = len(client.reports)
                if report is None:
                    shown["bar"].update(done, last="failed")
                    return
                seconds = report.compute_seconds + report.encode_seconds + report.send_seconds
                shown["bar"].update(
                    done, eps_spent=f"{report.epsilon_spent:.4g}", last_s=f"{seconds:.2f}"
                )

            with terminal_logging():
                reports = client.run(on_round=show)
    except SelfCheckFailed as exc:  # before any server was called
        log.error("cannot start: %s", exc)
        return 2
    except ProviderRefusal as exc:
        log.error("refusing to take part: %s", exc)
        return 3
    except KeyboardInterrupt as exc:
        signum, status = interrupted_status(exc)
        log.info("interrupted (signal %d)", signum)
        return status
    except (RunFailed, ModelFailed, TimeoutError, OSError, ValueError, *DATA_ERRORS) as exc:
        log.error("%s", exc)
        return 1
    except grpc.RpcError as exc:  # a refusal no step expects (e.g. removed from `providers`)
        code = exc.code().name if isinstance(exc, grpc.Call) else type(exc).__name__
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        log.error("a server refused a call: %s: %s", code, details)
        return 1
    finally:
        if "bar" in shown:
            shown["bar"].close()
    accepted = sum(r.accepted for r in reports)
    left_out = sum(bool(r.left_out) for r in reports)
    log.info(
        "done: %d round(s), %d accepted by every server%s",
        len(reports),
        accepted,
        f", {left_out} of them left out of the sum (see the warnings)" if left_out else "",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
