"""The `spgc` command line."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from spgc import __version__
from spgc.app import (
    account_cmd,
    bench_comm,
    bench_comm_cli,
    bench_gc,
    bench_load,
    bench_ot,
    bench_proof,
    bench_sampler,
    bench_scale,
    bench_wan,
    experiment,
    export_cmd,
)
from spgc.app.bench_gc import BenchError
from spgc.app.demo import DemoError, DemoOptions, run_cli
from spgc.app.experiment import run_from_args
from spgc.common.logs import setup_logging
from spgc.learning.data import DATA_ERRORS
from spgc.privacy.accounting import UNITS
from spgc.protocol.certs import DEFAULT_NAMES, DEFAULT_PROVIDERS, make_dev_pki, make_ledger_keys
from spgc.protocol.modes import BACKENDS, DEFAULT_SECURITY, SECURITY_NAMES, TRAINING_MODES
from spgc.providers.__main__ import main as provider_main
from spgc.providers.selfcheck import check_model_and_data
from spgc.servers.__main__ import main as server_main
from spgc.servers.evaluation import TestSetEvaluator, test_set_loader
from spgc.settings.backend_choice import AUTO
from spgc.settings.config import ConfigError, ServerConfig
from spgc.settings.config_files import (
    SCHEMAS,
    config_markdown,
    describe_keys,
    detect_schema,
    load_config,
)
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0: {text!r}")
    return value


def _probability(text: str) -> float:
    """A delta: strictly between 0 and 1."""
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1: {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65534:  # N and N + 1
        raise argparse.ArgumentTypeError(f"must be in 1..65534: {text!r}")
    return value


def _thread_counts(text: str) -> tuple[int, ...]:
    """ "1,2,4" -> (1, 2, 4): thread counts of `spgc bench gc --threads`, each 1..MAX_THREADS."""
    counts = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
        if not 1 <= value <= bench_gc.MAX_THREADS:
            raise argparse.ArgumentTypeError(
                f"each thread count must be in 1..{bench_gc.MAX_THREADS}: {text!r}"
            )
        counts.append(value)
    return tuple(counts)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="spgc",
        description="Two-server secure aggregation for differentially private collaborative "
        "learning.",
    )
    parser.add_argument("--version", action="version", version=f"spgc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    certs = sub.add_parser(
        "certs",
        help="make a development CA and per-party TLS certificates",
        description="Write a development CA (ca.pem, ca.key) and, per name, NAME.pem and NAME.key "
        "signed by it (EC P-256, one year, SAN localhost/127.0.0.1/NAME). Servers' certificates "
        "serve TLS and authenticate as clients; providers' only authenticate as clients, so a "
        "provider cannot pose as a server. With neither --names nor --providers: servers h1 h2, "
        "providers p1 p2 p3. A CA already in DIR signs the new certificates (adding a party). "
        "For development only.",
    )
    certs.add_argument("directory", type=Path, metavar="DIR")
    certs.add_argument(
        "--names",
        nargs="+",
        default=None,
        metavar="NAME",
        help=f"the servers to certify (default: {' '.join(DEFAULT_NAMES)} when --providers is "
        "not given, else none)",
    )
    certs.add_argument(
        "--providers",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the providers to certify, as TLS clients only (default: "
        f"{' '.join(DEFAULT_PROVIDERS)} when --names is not given, else none)",
    )
    certs.add_argument("--force", action="store_true", help="replace existing files")
    certs.add_argument(
        "--ledger-keys",
        nargs="+",
        default=[],
        metavar="NAME",
        help="also an Ed25519 key pair per server NAME signing its privacy ledger: "
        "NAME.ledger.key (the config key ledger_key) and NAME.ledger.pub (spgc account --keys)",
    )

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    gc = bench_sub.add_parser(
        "gc",
        help="garbled-circuit engine throughput (garbler and evaluator over loopback)",
        description="Garble and evaluate a 32-bit subtract/compare/select circuit on many "
        "instances, garbler and evaluator in two processes over loopback; check the output "
        "against plaintext evaluation.",
    )
    gc.add_argument(
        "--instances",
        type=_positive_int,
        default=None,
        metavar="N",
        help="circuit instances (default: 1000000; with --security malicious or both: "
        f"{bench_gc.MALICIOUS_DEFAULT_INSTANCES})",
    )
    gc.add_argument(
        "--chunk",
        type=_positive_int,
        default=None,
        metavar="N",
        help="instances per engine batch (default: the engine's)",
    )
    gc.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout (the table goes to stderr)",
    )
    gc.add_argument(
        "--threads",
        type=_thread_counts,
        default=(1,),
        metavar="T[,T...]",
        help="lanes per party (connections, sessions and threads, each on its own range of "
        f"instances), one run per count, each 1..{bench_gc.MAX_THREADS} (default: 1; e.g. 1,2,4)",
    )
    gc.add_argument(
        "--scheme",
        choices=(*bench_gc.SCHEMES, "both"),
        default=bench_gc.SCHEMES[0],
        help=f"how AND gates are garbled (default: {bench_gc.SCHEMES[0]}; both: one run each)",
    )
    gc.add_argument(
        "--backend",
        choices=(*bench_gc.BACKENDS, "both"),
        default="gc",
        help="gc: garbled circuits (the schemes of --scheme); gmw: GMW with Beaver triples from "
        "silent OT on the same circuit; both: each, with their AND gates per CPU-second compared "
        "(default: gc)",
    )
    gc.add_argument(
        "--security",
        choices=(*bench_gc.SECURITY_LEVELS, "both"),
        default="semi-honest",
        help="semi-honest: the backends as they are; malicious: their authenticated forms "
        "(security: malicious: authenticated garbling for gc, authenticated GMW for gmw); both: "
        "each level, compared in the same run (default: semi-honest)",
    )
    gc.add_argument(
        "--repeat",
        type=_positive_int,
        default=1,
        metavar="N",
        help="run every configuration N times (set after set) and report each one's median run "
        "and its range: timings on a shared machine are noisy (default: 1)",
    )
    gc.add_argument(
        "--ot-k",
        type=int,
        choices=range(9),
        default=bench_gc.DEFAULT_OT_K,
        metavar="K",
        help="OT extension for the evaluator's inputs: SoftSpoken k (1..8, ceil(128/k) bits "
        f"per input bit) or 0 for IKNP (default: {bench_gc.DEFAULT_OT_K})",
    )
    link = gc.add_mutually_exclusive_group()
    link.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext TCP link instead of TLS (benchmarking only)",
    )
    link.add_argument("--tls-only", action="store_true", help="TLS link only (the default)")
    link.add_argument("--both", action="store_true", help="run plaintext and TLS")

    sampler = bench_sampler.build_parser(
        bench_sub.add_parser(
            "sampler",
            help="discrete-Gaussian noise sampler: AND gates, random bits, bytes, samples/s",
            description=bench_sampler.__doc__,
        )
    )
    sampler.set_defaults(bench="sampler")

    ot = bench_ot.build_parser(
        bench_sub.add_parser(
            "ot",
            help="correlated OT between the servers: silent (Ferret) and SoftSpoken, bits per "
            "OT, OTs/s, setup",
            description=bench_ot.__doc__,
        )
    )
    ot.set_defaults(bench="ot")

    proof = bench_proof.build_parser(
        bench_sub.add_parser(
            "proof",
            help="a provider's norm proof: field, sizes, soundness, prove and verify seconds, "
            "upload against ring shares",
            description=bench_proof.__doc__,
        )
    )
    proof.set_defaults(bench="proof")

    scale = bench_scale.build_parser(
        bench_sub.add_parser(
            "scale",
            help="one spgc round of D coordinates on K worker pairs (Ray), and the scaling model",
            description=bench_scale.__doc__,
        )
    )
    scale.set_defaults(bench="scale")

    wan = bench_wan.build_parser(
        bench_sub.add_parser(
            "wan",
            help="steady-state rounds of the real daemons with the server-to-server links "
            "shaped to a round trip and a rate (gc, gmw, preprocessed)",
            description=bench_wan.__doc__,
        )
    )
    wan.set_defaults(bench="wan")

    comm = bench_comm_cli.build_parser(
        bench_sub.add_parser(
            "comm",
            help="bytes between the servers per step and per training, per mode and epsilon",
            description=bench_comm.__doc__,
        )
    )
    comm.set_defaults(bench="comm")

    load = bench_load.build_parser(
        bench_sub.add_parser(
            "load",
            help="N providers against both server daemons over TLS: seconds per round, missed "
            "providers, the servers' memory and CPU, with or without hostile traffic",
            description=bench_load.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    load.set_defaults(bench="load")

    demo = sub.add_parser(
        "demo",
        help="both servers and k providers on localhost, training a few rounds",
        description="Start both servers and the providers as separate processes on localhost "
        "(TLS with certificates made on the fly), train, show progress, stop everything.",
    )
    demo.add_argument(
        "--dataset",
        default="cancer",
        choices=["cancer", "diabetes", "mnist", "diabetes-regression"],
    )
    demo.add_argument(
        "--model",
        default="",
        metavar="MODEL",
        help="train this model instead of the dataset's own: a built-in name, e.g. mnist-wide "
        "(10M parameters), or your own factory, file.py:factory or package.module:factory",
    )
    demo.add_argument("--providers", type=_positive_int, default=3, metavar="K")
    demo.add_argument("--rounds", type=_positive_int, default=5, metavar="R")
    demo.add_argument("--mode", default="spgc", choices=list(TRAINING_MODES))
    demo.add_argument(
        "--epsilon",
        type=_positive_float,
        default=4.0,
        metavar="E",
        help="privacy budget for the whole training (default: 4)",
    )
    demo.add_argument("--delta", type=_probability, default=1e-5)
    demo.add_argument(
        "--clip",
        choices=["fixed", "adaptive", "decay"],
        default="fixed",
        help="adaptive: the clip norm follows the examples' median gradient norm, from a noisy "
        "count that travels with the shares (Andrew et al. 2021; the JSON's clip_norms); decay: "
        "it shrinks by 0.99 a round (servers' clip_decay, clip_min)",
    )
    demo.add_argument(
        "--clip-norm",
        type=_positive_float,
        metavar="C",
        help="the clip norm (with --clip adaptive the first round's; default 1, adaptive 0.1)",
    )
    demo.add_argument(
        "--backend",
        choices=[*BACKENDS, AUTO],
        default="gc",
        help="how the servers evaluate the round's circuits: gc (garbled circuits, the "
        "default), gmw (GMW with Beaver triples from silent OT: far fewer bytes, a round trip "
        "per AND layer) or auto (H1 measures the link at pairing and takes the one with the "
        "least expected round time)",
    )
    demo.add_argument(
        "--verify-inputs",
        choices=["none", "l2"],
        default=None,
        help="l2: every provider proves its vector is within the norm bound and the servers "
        "leave out a share whose proof fails (docs/PRIVACY.md, Norm proofs; modes spgc, "
        "only-mpc, dng, preprocessed); none: not checked (default: the servers' default, l2 "
        "in modes spgc, dng and preprocessed)",
    )
    demo.add_argument(
        "--adjacency",
        choices=list(UNITS),
        default="example",
        help="the unit of privacy: example (DP-SGD, the default) or provider (DP-FedAvg: each "
        "provider takes part with probability 0.5, trains one local epoch and shares its "
        "clipped model delta; epsilon per provider)",
    )
    demo.add_argument(
        "--noise-schedule",
        default="",
        metavar="R:Z:Q,...",
        help="with --adjacency provider: Geyer et al.'s phases, from release R on noise "
        "multiplier Z and sampling rate Q (e.g. 0:1.5:0.5,5:1.0:0.75), each release accounted "
        "with its own phase; the run stops at the target epsilon",
    )
    demo.add_argument(
        "--noise-floor",
        type=float,
        default=0.0,
        metavar="F",
        help="modes spgc and preprocessed: each server adds its own noise of variance F "
        "sigma^2 before the opening, the joint noise dropping to (1 - F) sigma^2 (the servers' "
        "noise_floor, docs/PRIVACY.md, The noise floor); 0: none",
    )
    demo.add_argument(
        "--security",
        choices=SECURITY_NAMES,
        default=DEFAULT_SECURITY,
        help="malicious: the noise made by authenticated garbling (backend gc) or "
        "authenticated GMW (gmw; auto chooses between them by their costs), so that one server "
        "that deviates is caught before anything of its round is released (the servers' "
        "security, docs/MALICIOUS.md; default: semi-honest)",
    )
    demo.add_argument("--insecure", action="store_true", help="plaintext links (testing only)")
    demo.add_argument("--timeout", type=_positive_float, default=600.0, metavar="S")
    demo.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    demo.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="keep the servers' state (checkpoints, exported model) in DIR/h1 and DIR/h2, and "
        "each provider's (its data set's budget file) in DIR/p1, ...",
    )
    demo.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus /metrics, /healthz and /readyz: H1 on port N, H2 on N+1 (127.0.0.1)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    experiment.build_parser(
        sub.add_parser(
            "experiment",
            help="the paper's accuracy experiment: dataset x mode x epsilon, CSV per epoch",
            description=experiment.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )

    config = sub.add_parser(
        "config",
        help="validate a configuration file, or list every key",
        description="`spgc config check FILE` validates a server or provider file (exit 2 with "
        "one message naming the file, key, value and what is allowed); `spgc config show "
        "server|provider` lists every key with its default and meaning.",
    )
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = config_sub.add_parser("check", help="validate FILE", description="Validate FILE.")
    check.add_argument("file", type=Path, metavar="FILE")
    check.add_argument(
        "--kind",
        choices=tuple(SCHEMAS),
        help="whose file it is (default: a provider's if it has name/h1_address, else a server's)",
    )
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.add_argument(
        "--schema-only",
        action="store_true",
        help="check keys and values only; by default the model, initial_model, data and "
        "test_data are also built and tried together, as the daemon does at its start",
    )
    show = config_sub.add_parser(
        "show", help="every key, its default and meaning", description="List every key."
    )
    show.add_argument("kind", choices=tuple(SCHEMAS))
    show.add_argument("--markdown", action="store_true", help="docs/CONFIG.md for both daemons")
    export_cmd.add_parser(sub)
    account_cmd.add_parser(sub)

    # The daemons parse their own options (one parser each, shared with the spgc-server and
    # spgc-provider aliases); these entries are for `spgc --help` only: main() hands them over.
    sub.add_parser("server", help="run a server daemon (spgc server --help lists its options)")
    sub.add_parser("provider", help="run a provider (spgc provider --help lists its options)")
    return parser


def _cmd_certs(args: argparse.Namespace) -> int:
    servers, providers = args.names or (), args.providers or ()
    if args.names is None and args.providers is None:
        servers, providers = DEFAULT_NAMES, DEFAULT_PROVIDERS
    made = make_dev_pki(args.directory, servers, force=args.force, providers=providers)
    ca = next(iter(made.values())).ca
    print(f"CA: {ca} (key {ca.with_suffix('.key')})")
    for name, paths in made.items():
        print(f"{name}: {paths.cert} (key {paths.key})")
    signing = (
        make_ledger_keys(args.directory, args.ledger_keys, force=args.force)
        if args.ledger_keys
        else {}
    )
    for name, (key, pub) in signing.items():
        print(f"{name} ledger signing key: {key} (public {pub})")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:

    if args.bench == "sampler":
        return bench_sampler.run_from_args(args)
    if args.bench == "comm":
        return bench_comm_cli.run_from_args(args)
    if args.bench == "load":
        return bench_load.run_from_args(args)
    if args.bench == "ot":
        return bench_ot.run_from_args(args)
    if args.bench == "proof":
        return bench_proof.run_from_args(args)
    if args.bench == "scale":
        return bench_scale.run_from_args(args)
    if args.bench == "wan":
        return bench_wan.run_from_args(args)
    security = bench_gc.SECURITY_LEVELS if args.security == "both" else (args.security,)
    instances = args.instances or (
        bench_gc.MALICIOUS_DEFAULT_INSTANCES if "malicious" in security else 1_000_000
    )
    return bench_gc.run_cli(
        instances=instances,
        insecure=args.insecure,
        both=args.both,
        chunk=args.chunk,
        as_json=args.json,
        threads=args.threads,
        schemes=bench_gc.SCHEMES if args.scheme == "both" else (args.scheme,),
        ot_k=args.ot_k,
        repeat=args.repeat,
        backends=bench_gc.BACKENDS if args.backend == "both" else (args.backend,),
        security=security,
    )


def _cmd_demo(args: argparse.Namespace) -> int:

    opts = DemoOptions(
        dataset=args.dataset,
        providers=args.providers,
        rounds=args.rounds,
        mode=args.mode,
        epsilon=args.epsilon,
        delta=args.delta,
        insecure=args.insecure,
        model=args.model,
        timeout=args.timeout,
        keep=args.keep,
        state_dir=args.state_dir,
        metrics_port=args.metrics_port,
        clip=args.clip,
        clip_norm=args.clip_norm,
        backend=args.backend,
        verify_inputs=args.verify_inputs,
        adjacency=args.adjacency,
        noise_schedule=args.noise_schedule,
        noise_floor=args.noise_floor,
        security=args.security,
    )
    return run_cli(opts, args.json)


def _cmd_experiment(args: argparse.Namespace) -> int:

    return run_from_args(args)


def _cmd_config(args: argparse.Namespace) -> int:
    if args.config_command == "show":
        if args.markdown:
            print(config_markdown())
            return 0
        for key, kind, default, meaning in describe_keys(SCHEMAS[args.kind]):
            print(f"{key} ({kind}, default {default})\n    {meaning}")
        return 0
    kind = args.kind or detect_schema(args.file)
    setup_logging("warning")  # the accountant's chatter (absl) stays out of a check's output
    try:
        cfg = load_config(SCHEMAS[kind], args.file, args.overrides)  # type: ignore[type-var]
        what = "" if args.schema_only else _try_model_and_data(cfg)
    except ConfigError as exc:
        print(f"spgc config check: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError, *DATA_ERRORS) as exc:
        print(f"spgc config check: {args.file}: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: a valid {kind} configuration{what}")
    return 0


def _try_model_and_data(cfg: ServerConfig | ProviderConfig) -> str:
    """What the daemon would build at its start, built now: the model (and initial_model), the
    run's plan, the data and test_data, tried together. Returns a note for the check's line."""
    if isinstance(cfg, ServerConfig):
        tls = cfg.tls.files() if cfg.tls is not None else None
    else:
        tls = cfg.tls
    if tls is not None:
        tls.check()
    if isinstance(cfg, ServerConfig):
        plan = make_plan(cfg)
        if cfg.test_data and cfg.evaluate:
            loader = test_set_loader(cfg)
            assert loader is not None
            TestSetEvaluator(plan.model_name, loader, cfg.task, cfg.loss_name).check(
                f"test_data {cfg.test_data!r}"
            )
        trained = plan.coordinates.describe()
        return f" (model {plan.model_name}: {trained}, ring Z_2^{plan.ring_bits})"
    # The check each provider makes of itself at its start (providers/selfcheck.py).
    found = check_model_and_data(cfg)
    if found.scale_warning is not None:
        print(f"spgc config check: warning: {found.scale_warning}", file=sys.stderr)
    return found.note


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for user errors, with a one-line message)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except BrokenPipeError:  # `spgc ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "server":
        return server_main(argv[1:])
    if argv and argv[0] == "provider":
        return provider_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {
        "certs": _cmd_certs,
        "bench": _cmd_bench,
        "demo": _cmd_demo,
        "config": _cmd_config,
        "export": export_cmd.run,
        "account": account_cmd.run,
        "experiment": _cmd_experiment,
    }

    try:
        return handlers[args.command](args)
    except (BenchError, DemoError, OSError, ValueError, *DATA_ERRORS) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
