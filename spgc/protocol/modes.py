"""The one table of modes (SPEC section 5): who adds noise, how many servers, which circuit.

Everything that lists or branches on modes reads this table: the CLI's choices, the server
config, the plan (and its wire enum), the demo, the benchmarks, the servers and the providers.
A new mode is one :class:`Mode` row here plus its round logic in ``servers/coordinator.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ADAPTIVE_CLIP_MODES",
    "BACKENDS",
    "BACKEND_MODES",
    "BACKEND_NAMES",
    "BASELINES",
    "DEFAULT_SECURITY",
    "MALICIOUS_VARIANTS",
    "MODES",
    "NOISE_FLOOR_MODES",
    "NOISY_MODES",
    "SECURITY_LEVELS",
    "SECURITY_NAMES",
    "SINGLE_SERVER_MODES",
    "TRAINING_MODES",
    "TWO_SERVER_MODES",
    "VERIFIED_BY_DEFAULT",
    "VERIFIED_MODES",
    "Mode",
    "default_verify_inputs",
    "get_mode",
    "malicious_refusal",
]


@dataclass(frozen=True)
class Mode:
    """One way to run a training step."""

    name: str  # what users type (--mode, config key ``mode``)
    label: str  # one line for tables and help
    servers: int  # 1 (the provider's vector goes to one server in clear) or 2 (additive shares)
    circuit: str  # garbled circuit per round: "reconstruct+noise", "reconstruct", "offline", ""
    noise_by: str  # who adds the DP noise: "circuit", "each provider", "each server", "nobody"
    differentially_private: bool  # does the released model carry a DP guarantee?
    # False for benchmark baselines, which run in `spgc bench comm` but cannot train.
    trainable: bool = True
    # The aggregation.proto Mode enum value name (TrainingConfig.mode); "" for baselines.
    wire_name: str = ""

    @property
    def noisy(self) -> bool:
        """Adds noise whose size follows the privacy target (its cost depends on sigma)."""
        return self.noise_by != "nobody"


_TABLE = (
    Mode("spgc", "exact discrete Gaussian in the circuit, from both servers' seeds", 2,
         "reconstruct+noise", "circuit", True, wire_name="MODE_SPGC"),
    Mode("only-mpc", "reconstruct only, no noise (paper's Only-MPC): NOT differentially private",
         2, "reconstruct", "nobody", False, wire_name="MODE_ONLY_MPC"),
    Mode("plain", "one server sums the vectors in clear (paper's Non-privacy): NOT "
         "differentially private", 1, "", "nobody", False, wire_name="MODE_PLAIN"),
    Mode("ldp", "each provider adds full noise to its own vector (paper's LDP)", 1, "",
         "each provider", True, wire_name="MODE_LDP"),
    Mode("dng", "each server adds full noise to its share, exchanges one ring element", 2, "",
         "each server", True, wire_name="MODE_DNG"),
    Mode("preprocessed", "noise shares made by the circuit offline, S + z opened online", 2,
         "offline", "circuit", True, wire_name="MODE_PREPROCESSED"),
    # The paper's table sampler (lambda = 16, ring N = 16): a labelled benchmark baseline that is
    # NOT differentially private at these noise scales (SPEC section 4).
    Mode("table16", "paper's table sampler, lambda=16, N=16: NOT differentially private", 2,
         "reconstruct+noise", "circuit", False, trainable=False),
)  # fmt: skip

#: Every mode by name, training modes first, baselines last.
MODES: dict[str, Mode] = {m.name: m for m in _TABLE}
#: The modes a run can train in (CLI choices, config values, the wire enum).
TRAINING_MODES: tuple[str, ...] = tuple(m.name for m in _TABLE if m.trainable)
#: Benchmark-only baselines.
BASELINES: tuple[str, ...] = tuple(m.name for m in _TABLE if not m.trainable)
#: Training modes with one server (role 1, no peer, no garbled circuit).
SINGLE_SERVER_MODES: tuple[str, ...] = tuple(
    m.name for m in _TABLE if m.trainable and m.servers == 1
)
#: Training modes with two servers.
TWO_SERVER_MODES: tuple[str, ...] = tuple(m.name for m in _TABLE if m.trainable and m.servers == 2)
#: Training modes that add DP noise (calibrated from target_epsilon or noise_multiplier).
NOISY_MODES: tuple[str, ...] = tuple(m.name for m in _TABLE if m.trainable and m.noisy)
#: Training modes that run adaptive clipping (clip: adaptive): the unclipped-example count
#: travels as one more coordinate of the vectors and is noised with the rest, by the circuit
#: or (ldp) by each provider's own noise (the released count then carries k providers' noises).
#: The other modes' noise (each server's, the preprocessed pool) is sized for the model's
#: coordinates only.
ADAPTIVE_CLIP_MODES: tuple[str, ...] = tuple(
    m.name
    for m in _TABLE
    if m.trainable and (m.circuit == "reconstruct+noise" or m.noise_by == "each provider")
)


def get_mode(name: str) -> Mode:
    """The table row for ``name``; ValueError naming the choices for an unknown one."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; choose from {', '.join(MODES)}") from None


#: How the two servers evaluate a round's circuits (the same circuit descriptions either way):
#: ``gc`` garbles them (three-halves, about 24.6 bytes per AND gate, a constant number of round
#: trips), ``gmw`` evaluates XOR shares with Boolean Beaver triples from silent OT (well under a
#: byte per AND gate, one round trip per AND layer of the circuit). docs/ENGINE.md.
BACKENDS: dict[str, str] = {
    "gc": "garbled circuits (three-halves): bytes per AND gate, constant round trips",
    "gmw": "GMW, Beaver triples from silent OT (Ferret): under a byte per AND, a round trip "
    "per AND layer",
}
#: The backends' names (config values, CLI choices).
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)
#: Training modes whose servers run circuits, online or offline (preprocessed's noise pool):
#: the ones a backend applies to.
BACKEND_MODES: tuple[str, ...] = tuple(m.name for m in _TABLE if m.trainable and m.circuit)
#: Training modes whose two servers can check the providers' norm proofs (verify_inputs: l2,
#: spgc.protocol.norm_proof): the sums are field shares, reconstructed by the round's circuit or
#: opened
#: in the field with the servers' noise (their own, or preprocessed's pool of field shares).
VERIFIED_MODES: tuple[str, ...] = ("spgc", "only-mpc", "dng", "preprocessed")
#: Modes whose two servers make the noise jointly (the round circuit, the preprocessed pool):
#: where a noise_floor (issue 46) moves part of its variance to each server's own noise.
NOISE_FLOOR_MODES: tuple[str, ...] = ("spgc", "preprocessed")
#: Where verify_inputs defaults to l2: the two-server DP modes.
VERIFIED_BY_DEFAULT: tuple[str, ...] = ("spgc", "dng", "preprocessed")


def default_verify_inputs(mode: str) -> str:
    """verify_inputs when a config leaves it unset: l2 in the two-server DP modes."""
    return "l2" if mode in VERIFIED_BY_DEFAULT else "none"

#: ``security`` (issue 46, docs/MALICIOUS.md): what the two servers' circuits are secure against.
#: ``semi-honest`` on every backend and mode; ``malicious`` only where the table below has a
#: variant.
SECURITY_LEVELS: dict[str, str] = {
    "semi-honest": "secure against servers that follow the protocol (every backend and mode)",
    "malicious": "a server that deviates is caught before anything of its round is released "
    "(MALICIOUS_VARIANTS)",
}
#: The security levels' names (config values, the plan's wire value, ledger headers).
SECURITY_NAMES: tuple[str, ...] = tuple(SECURITY_LEVELS)
#: The level of a plan that names none (the config's default; a TrainingConfig or ledger
#: header without the field).
DEFAULT_SECURITY = "semi-honest"
#: The one table of what has ``security: malicious``: (backend, mode) -> the protocol that
#: runs it. Everything else is refused at config load (:func:`malicious_refusal`); docs/PRIVACY.md
#: ("What a server that deviates can do today") and docs/MALICIOUS.md say the same.
MALICIOUS_VARIANTS: dict[tuple[str, str], str] = {
    ("gmw", "spgc"): "authenticated GMW",
    # the pool's production on authenticated GMW; the online opening is safe as it is
    # (docs/PRIVACY.md, "The online opening of mode preprocessed")
    ("gmw", "preprocessed"): "authenticated GMW",
    # authenticated garbling (Wang, Ranellucci and Katz 2017): a constant number of round
    # trips a run, for links where GMW's round trips hurt (docs/MALICIOUS.md, layer 3b)
    ("gc", "spgc"): "authenticated garbling",
    ("gc", "preprocessed"): "authenticated garbling",
}


def malicious_refusal(backend: str, mode: str) -> str | None:
    """Why ``security: malicious`` cannot run with ``backend`` and ``mode``, in one line naming
    what is supported (None: it can)."""
    if (backend, mode) in MALICIOUS_VARIANTS:
        return None
    if backend not in BACKENDS and all((b, mode) in MALICIOUS_VARIANTS for b in BACKENDS):
        return None  # auto: it chooses among backends that all have one, by their costs
    by_backend: dict[tuple[str, str], list[str]] = {}
    for (b, m), how in MALICIOUS_VARIANTS.items():
        by_backend.setdefault((b, how), []).append(m)
    supported = " or ".join(
        f"backend: {b} and mode: {' or '.join(ms)} ({how})" for (b, how), ms in by_backend.items()
    )
    backends = {b for b, _ in MALICIOUS_VARIANTS}
    modes = {m for _, m in MALICIOUS_VARIANTS}
    if backend not in BACKENDS and backend not in backends and backends >= set(BACKENDS):
        why = f"mode {mode} has no malicious variant yet"  # auto, in a mode without one
    elif backend in backends and mode in modes:
        why = f"mode {mode} has no malicious variant on backend {backend} yet"
    elif backend in BACKENDS or backend in backends:
        lacking = [f"backend {backend}"] if backend not in backends else []
        lacking += [f"mode {mode}"] if mode not in modes else []
        why = f"{' and '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no "
        why += "malicious variant yet"
    else:  # auto: the choice may fall on a backend without one
        others = ", ".join(sorted(set(BACKENDS) - backends))
        why = f"backend {backend} may choose {others}, which has no malicious variant yet"
    return f"security: malicious needs {supported}; {why}"
