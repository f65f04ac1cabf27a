"""The ledger verifier: a server's ledger checked line by line (the chain, every line's
signature and the other server's co-signature, the plan) and its epsilon re-accounted from
the plan and the entries (spgc.privacy.ledger has the format; docs/PRIVACY.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from spgc.privacy.accounting import PrivacyAccountant, adjacency_of, capped_poisson, reported_delta
from spgc.privacy.clipping import DecayClip
from spgc.privacy.ledger_format import (
    ABORT_KEYS,
    EPSILON_TOLERANCE,
    EVIDENCE_KINDS,
    FEATURE_STATS_RELEASE,
    FORMAT,
    MAX_CHECK_CHARS,
    OPTIONAL_PLAN_KEYS,
    PLAN_KEYS,
    ROLES,
    LedgerError,
    _sha256,
    canonical,
    chain_after,
    is_sha256_hex,
    plan_digest,
    read_ledger_lines,
    signers,
    statement_bytes,
    verify_statement,
)
from spgc.privacy.noise_floor import floor_epsilons
from spgc.protocol.modes import DEFAULT_SECURITY, SECURITY_NAMES, get_mode, malicious_refusal


@dataclass
class LedgerReport:
    """What :func:`verify_ledger` found."""

    run_id: str
    server: str
    public_key: str
    peer_public_key: str | None  # the other server's key (None: a one-server mode)
    steps: int  # release entries: every one counted (the feature statistics' included)
    released: int  # of which a released line followed
    epsilon: float | None  # re-accounted from the entries (None: no noise, not DP)
    epsilon_recorded: float | None  # the last release entry's own count
    delta: float | None  # the accountant's (the header's), None without DP
    noise_samples: int
    # The delta of the guarantee: the accountant's plus the sampler's distance and the capped
    # Poisson batches (spgc.privacy.accounting.reported_delta, as the servers report it).
    delta_reported: float | None = None
    signatures_valid: bool = True
    cosigned: bool = False  # every release entry also carries the peer server's signature
    keys_pinned: bool = False  # both keys matched the expected ones, each in its role
    clip: dict[str, Any] | None = None  # the header's clip rule (fixed or adaptive)
    clip_norms: list[float] | None = None  # each release's clip norm, in order
    # How the servers evaluated the circuits (gc or gmw; bound by plan_sha256), as the header
    # names it ("gc" for a ledger that predates the field).
    backend: str = "gc"
    # l2: the servers checked every provider's norm proof (the header's verify_inputs).
    verify_inputs: str = "none"
    # The guarantee's neighbouring relation (spgc.privacy.accounting.adjacency_of), from the
    # header's
    # sampling: "add/remove one example", "... one provider", "replace one example"; None
    # without DP.
    adjacency: str | None = None
    # The co-signed ledger head after the last release entry (plan_digest with none), and
    # whether a closing entry (co-signed in two-server modes) says no release follows it.
    head: str = ""
    closed: bool = False
    # The head after 0, 1, ..., steps release entries (what a model's head is checked against).
    heads: list[str] = field(default_factory=list, repr=False)
    # Of the release entries, the feature statistics' (standardize: true; 0 or 1).
    feature_stats_releases: int = 0
    # noise_floor (issue 46): {"fraction", "coordinates", "epsilon": {figure: eps or None}};
    # None without one.
    noise_floor: dict[str, Any] | None = None
    # What the circuits were secure against (the header's security; semi-honest without one).
    security: str = DEFAULT_SECURITY
    # The server stopped the run on catching the peer deviating: its abort entry's round,
    # check, evidence and evidence_digest, and time (signed by it alone); None: no abort.
    abort: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        # noise_floor and abort only when there is one: a ledger without them reports as before.
        return {
            k: v
            for k, v in self.__dict__.items()
            if k != "heads" and not (k in ("noise_floor", "abort") and v is None)
        }


def verify_ledger(
    source: Path | str | list[bytes], expected_keys: Mapping[str, str] | None = None
) -> LedgerReport:
    """Check the chain and every signature and re-account epsilon from the release entries.
    LedgerError naming the line on a broken chain, a bad signature, a header whose keys are not
    ``expected_keys`` (role -> hex public key, each pinned to its role: the header's own key to
    its ``server``, its peer's to ``peer``), a recorded epsilon below the re-accounted one (an
    under-count), or above it (release entries missing). :class:`LedgerVerifier` does the same
    a few lines at a time."""
    if isinstance(source, list):
        lines = source
    else:
        try:
            lines = read_ledger_lines(Path(source))
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger: {exc}") from None
    verifier = LedgerVerifier(expected_keys)
    verifier.feed(lines)
    return verifier.report()


class LedgerVerifier:
    """:func:`verify_ledger` for a ledger read as it grows (a provider fetching the servers'
    ledgers a round at a time): :meth:`feed` checks the lines after those fed before, each
    line once; :meth:`report` checks the whole so far (the re-accounted epsilon) and reports
    it. A line that fails leaves the verifier refusing every later call."""

    def __init__(self, expected_keys: Mapping[str, str] | None = None) -> None:
        self.expected_keys = expected_keys
        self.lines = 0  # lines checked so far
        self._failed: LedgerError | None = None
        self._header: dict[str, Any] = {}
        self._public: Ed25519PublicKey | None = None
        self._prev: bytes | None = None
        self._steps = self._released = self._samples = self._stats_releases = 0
        self._recorded: float | None = None
        self._recorded_line = 0  # the last release entry's line
        self._rounds: dict[int, int] = {}  # release index -> its round
        self._clip_norms: list[float] = []
        self._seen_released: set[int] = set()
        self._heads: list[str] = []  # the co-signed head after 0, 1, ... release entries
        self._closed_line = 0
        self._abort: dict[str, Any] | None = None  # the abort entry (nothing may follow it)
        self._abort_line = 0

    @property
    def release_rounds(self) -> list[int]:
        """The round of each release entry checked so far, in the ledger's order."""
        return list(self._rounds.values())

    def feed(self, lines: list[bytes]) -> None:
        """Check ``lines``, the ledger's next ones (blank ones skipped): LedgerError naming the
        line (numbered from the ledger's first) on the first that fails."""
        if self._failed is not None:
            raise self._failed
        try:
            for raw in lines:
                if raw.strip():
                    self._check_line(self.lines + 1, raw)
                    self.lines += 1
        except LedgerError as exc:
            self._failed = exc
            raise

    def _check_line(self, number: int, raw: bytes) -> None:
        try:
            entry = json.loads(raw)
        except ValueError:
            raise LedgerError(f"line {number}: not JSON") from None
        if not isinstance(entry, dict):
            raise LedgerError(f"line {number}: not a JSON object")
        want = None if self._prev is None else _sha256(self._prev)
        if entry.get("prev") != want:
            raise LedgerError(f"line {number}: broken chain (prev does not hash line {number - 1})")
        if self._closed_line:
            raise LedgerError(
                f"line {number}: follows the closing entry (line {self._closed_line}): a closed "
                "run's ledger holds nothing after it"
            )
        if self._abort_line:
            raise LedgerError(
                f"line {number}: follows the abort entry (line {self._abort_line}): an aborted "
                "run's ledger holds nothing after it"
            )
        if number == 1:
            self._public = _check_header(entry, self.expected_keys)
            self._header = entry
            self._heads.append(plan_digest(entry))
        public, header = self._public, self._header
        assert public is not None
        unsigned = {k: v for k, v in entry.items() if k != "sig"}
        try:
            public.verify(bytes.fromhex(str(entry.get("sig", ""))), canonical(unsigned))
        except (InvalidSignature, ValueError):
            raise LedgerError(f"line {number}: bad signature") from None
        if canonical(entry) != raw:
            raise LedgerError(f"line {number}: not in canonical form")
        kind = entry.get("kind")
        steps = self._steps
        if kind == "release":
            if not _is_int(entry.get("index")) or entry["index"] != steps:
                raise LedgerError(f"line {number}: release index {entry.get('index')}, "
                                  f"expected {steps}")  # fmt: skip
            _check_cosigned(number, entry, header, self._heads[-1])
            count = entry.get("noise_samples")
            if not _is_int(count) or count < 0 or not _is_int(entry.get("round")):
                raise LedgerError(f"line {number}: round and noise_samples must be integers >= 0")
            after = entry.get("epsilon_after")
            if after is not None and not (
                isinstance(after, (int, float)) and not isinstance(after, bool) and after >= 0
            ):
                raise LedgerError(f"line {number}: epsilon_after must be a number >= 0 or null")
            if self._recorded_line and _above(self._recorded, after):
                raise LedgerError(
                    f"line {number}: epsilon_after {after} is below the previous entry's "
                    f"{self._recorded}"
                )
            if _is_feature_stats(number, entry, header, steps):
                self._stats_releases += 1
            else:
                self._clip_norms.append(_release_clip_norm(number, entry, header["clip"]))
            self._rounds[steps] = entry["round"]
            self._steps += 1
            self._samples += count
            self._recorded, self._recorded_line = after, number
            self._heads.append(chain_after(entry))
        elif kind == "close":
            _check_cosigned(number, entry, header, self._heads[-1])
            if entry.get("releases") != steps:
                raise LedgerError(
                    f"line {number}: the closing entry counts {entry.get('releases')!r} "
                    f"releases, the ledger holds {steps}"
                )
            self._closed_line = number
        elif kind == "abort":
            self._abort = _check_abort(number, entry, header, self._rounds.get(steps - 1))
            self._abort_line = number
        elif kind == "released":
            index = entry.get("index")
            if not _is_int(index) or index not in self._rounds:
                raise LedgerError(f"line {number}: released index {index!r} has no release entry "
                                  "before it")  # fmt: skip
            if index in self._seen_released:
                raise LedgerError(f"line {number}: a second released line for index {index}")
            if entry.get("round") != self._rounds[index]:
                raise LedgerError(
                    f"line {number}: round {entry.get('round')!r}, but release {index} was "
                    f"for round {self._rounds[index]}"
                )
            self._seen_released.add(index)
            self._released += 1
        elif number != 1:
            raise LedgerError(f"line {number}: unknown kind {kind!r}")
        self._prev = raw

    def report(self) -> LedgerReport:
        """The ledger fed so far, its epsilon re-accounted from its release entries
        (LedgerError when it is empty, or the recorded epsilon is not the re-accounted one)."""
        if self._failed is not None:
            raise self._failed
        if not self.lines:
            raise LedgerError("the ledger is empty")
        header, steps, recorded = self._header, self._steps, self._recorded
        epsilon = _reaccount(header, steps - self._stats_releases, self._stats_releases)
        # A recorded null with noise is an infinite epsilon (JSON has no Infinity).
        if epsilon is not None and steps and _above(epsilon, recorded, EPSILON_TOLERANCE):
            raise LedgerError(
                f"line {self._recorded_line}: the {steps} release entries re-account to epsilon "
                f"{epsilon:.6g}, above the recorded {recorded}"
            )
        if epsilon is not None and steps and _above(recorded, epsilon, EPSILON_TOLERANCE):
            # The server counts every release it made: a recorded figure above what the
            # entries give means release entries are missing (a cut-off ledger continued).
            raise LedgerError(
                f"line {self._recorded_line}: the server recorded epsilon {recorded} after its "
                f"releases, but the {steps} release entries here re-account to only "
                f"{epsilon:.6g}: entries are missing"
            )
        delta_reported = None
        if epsilon is not None and math.isfinite(epsilon):
            capped = capped_poisson(header.get("sampling") or {}, header["max_batch_size"])
            delta_reported = reported_delta(
                float(header["delta"]), epsilon, self._samples, steps if capped else 0
            )
        return LedgerReport(
            run_id=str(header.get("run_id", "")),
            server=str(header.get("server", "")),
            public_key=str(header.get("public_key", "")),
            peer_public_key=header.get("peer_public_key"),
            steps=steps,
            released=self._released,
            epsilon=epsilon,
            epsilon_recorded=recorded,
            delta=header.get("delta") if epsilon is not None else None,
            noise_samples=self._samples,
            delta_reported=delta_reported,
            cosigned=header.get("peer_public_key") is not None,
            keys_pinned=self.expected_keys is not None,
            clip=header.get("clip"),
            clip_norms=list(self._clip_norms),
            backend=str(header["backend"]),
            verify_inputs=str(header["verify_inputs"]),
            adjacency=None if epsilon is None else _adjacency(header),
            head=self._heads[-1],
            closed=bool(self._closed_line),
            heads=list(self._heads),
            feature_stats_releases=self._stats_releases,
            noise_floor=_floor_report(header, steps),
            security=str(header.get("security", DEFAULT_SECURITY)),
            abort=self._abort,
        )


def _check_abort(
    number: int, entry: Mapping[str, Any], header: Mapping[str, Any], last_round: int | None
) -> dict[str, Any]:
    """An abort entry: a two-server run's, its round not before the last release entry's, the
    check's message, and the evidence's kind and SHA-256. Signed by its server alone (its
    ``sig``, checked with every line): the peer it caught does not co-sign. Returns its
    fields."""
    if header.get("peer_public_key") is None:
        raise LedgerError(f"line {number}: an abort entry in a one-server ledger (no peer)")
    r, check = entry.get("round"), entry.get("check")
    if not _is_int(r) or r < 0 or (last_round is not None and r < last_round):
        raise LedgerError(
            f"line {number}: the abort's round {r!r} must be an integer >= 0, not before the "
            f"last release's ({last_round})"
        )
    if not isinstance(check, str) or not check or len(check) > MAX_CHECK_CHARS + 3:
        raise LedgerError(f"line {number}: the abort's check must be its message (text)")
    if entry.get("evidence") not in EVIDENCE_KINDS or not is_sha256_hex(
        entry.get("evidence_digest")
    ):
        raise LedgerError(
            f"line {number}: the abort's evidence must be one of {', '.join(EVIDENCE_KINDS)} "
            "with evidence_digest its SHA-256 (64 hex characters)"
        )
    return {k: entry[k] for k in (*ABORT_KEYS, "time") if k in entry}


def _floor_report(header: Mapping[str, Any], steps: int) -> dict[str, Any] | None:
    floor = header.get("noise_floor")
    if floor is None:
        return None
    return {**floor, "epsilon": floor_epsilons(header, steps)}


def _is_feature_stats(
    number: int, entry: Mapping[str, Any], header: Mapping[str, Any], index: int
) -> bool:
    """Whether a release entry is the feature statistics' release: once, as the first
    release, of a plan whose header names it; LedgerError for any other ``release`` value or
    place."""
    what = entry.get("release")
    if what is None:
        return False
    if what != FEATURE_STATS_RELEASE:
        raise LedgerError(f"line {number}: unknown release {what!r}")
    if header.get("feature_stats") is None:
        raise LedgerError(
            f"line {number}: a feature statistics release, but the header's plan has none"
        )
    if index != 0:
        raise LedgerError(
            f"line {number}: the feature statistics are released once, before the first step; "
            f"this is release {index}"
        )
    return True


def _check_cosigned(
    number: int, entry: Mapping[str, Any], header: Mapping[str, Any], head: str
) -> None:
    """A release or closing entry: the header's plan repeated, its keys as signers, the head
    before it as ``chain``, and (two-server modes) the peer's signature over its statement."""
    for key in (*PLAN_KEYS, *OPTIONAL_PLAN_KEYS):
        if entry.get(key) != header.get(key):
            raise LedgerError(f"line {number}: {key} differs from the header's")
    if entry.get("signers") != signers(header):
        raise LedgerError(f"line {number}: signers differ from the header's keys")
    if entry.get("chain") != head:
        raise LedgerError(
            f"line {number}: chain does not name the co-signed entry before it (a release "
            "entry was dropped, moved or changed before this one)"
        )
    peer_hex = header.get("peer_public_key")
    if peer_hex is not None and not verify_statement(
        peer_hex, statement_bytes(entry), _hex_bytes(entry.get("peer_sig"))
    ):
        raise LedgerError(
            f"line {number}: bad or missing signature of the peer server "
            f"{header.get('peer')!r} (peer_sig)"
        )


def _adjacency(header: Mapping[str, Any]) -> str:
    sampling = header.get("sampling") or {}
    return adjacency_of(
        str(sampling.get("sampling", "poisson")), str(sampling.get("unit", "example"))
    )


def _check_header(entry: dict[str, Any], expected_keys: Mapping[str, str] | None) -> Any:
    """Line 1: a header of this format whose roles and keys make sense (and are the pinned
    ones); returns its public key. LedgerError naming what is wrong."""
    if entry.get("kind") != "header":
        raise LedgerError("line 1: not a ledger header")
    if entry.get("format") != FORMAT:
        old = {
            1: " (written before delta and accountant were co-signed)",
            2: " (written before the clip norms were co-signed)",
            3: " (written before backend, verify_inputs, each release's index and epsilon and "
            "the chain of co-signed entries were co-signed, and before closing entries)",
        }.get(entry.get("format"), "")  # type: ignore[arg-type]
        raise LedgerError(
            f"line 1: ledger format {entry.get('format')!r}{old}; this version verifies format "
            f"{FORMAT} only"
        )
    for key in PLAN_KEYS:
        if key not in entry:
            raise LedgerError(f"line 1: the header has no {key}")
    if not _is_int(entry.get("max_batch_size")) or entry["max_batch_size"] < 0:
        raise LedgerError("line 1: max_batch_size must be an integer >= 0")
    for key in ("backend", "verify_inputs"):
        if not isinstance(entry.get(key), str):
            raise LedgerError(f"line 1: {key} must be a string")
    _check_security(entry)
    _check_clip(entry["clip"], entry.get("noise_multiplier"))
    if "feature_stats" in entry:
        _check_feature_stats(entry["feature_stats"])
    _check_noise_floor(entry.get("noise_floor"), entry.get("noise_multiplier"))
    if "noise_floor" in entry and "feature_stats" in entry:
        raise LedgerError("line 1: a noise_floor with feature_stats (no server writes both)")
    try:
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(entry["public_key"]))
    except (KeyError, TypeError, ValueError):
        raise LedgerError("line 1: no valid public_key") from None
    server, peer = entry.get("server"), entry.get("peer")
    if server not in ROLES:
        raise LedgerError(f"line 1: server {server!r} is not a role ({', '.join(ROLES)})")
    peer_hex = entry.get("peer_public_key")
    two = _servers(entry.get("mode")) == 2
    if two:
        if peer_hex is None:
            raise LedgerError(
                f"line 1: mode {entry.get('mode')!r} has two servers but the header names no "
                "peer_public_key"
            )
        if peer not in ROLES or peer == server:
            raise LedgerError(f"line 1: peer {peer!r} is not the other role than {server!r}")
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(peer_hex))
        except (TypeError, ValueError):
            raise LedgerError("line 1: peer_public_key is not an Ed25519 key") from None
        if str(peer_hex).lower() == str(entry["public_key"]).lower():
            raise LedgerError(
                "line 1: the header names this server's own key as the peer server's: no "
                "second server co-signed this ledger"
            )
    elif peer_hex is not None:
        raise LedgerError(f"line 1: mode {entry.get('mode')!r} has one server but names a peer")
    if expected_keys is not None:
        pinned = {role: key.lower() for role, key in expected_keys.items()}
        named = {server: entry["public_key"]}
        if two:
            named[peer] = peer_hex
        for role, key in named.items():
            if role not in pinned:
                raise LedgerError(f"line 1: no key pinned for {role} (--keys {role}=PEM)")
            if str(key).lower() != pinned[role]:
                which = "this server's public_key" if role == server else "peer_public_key"
                raise LedgerError(f"line 1: {which} is not the key pinned for {role} (--keys)")
    return public


def _check_feature_stats(plan: Any) -> None:
    """The header's feature_stats: the release's noise multiplier and sensitivity (> 0) and
    its feature count (an integer >= 1)."""
    if not isinstance(plan, dict) or set(plan) != {
        "noise_multiplier",
        "sensitivity_units",
        "features",
    }:
        raise LedgerError(
            "line 1: feature_stats must be {noise_multiplier, sensitivity_units, features}"
        )
    if not (_number(plan["noise_multiplier"]) and plan["noise_multiplier"] > 0):
        raise LedgerError("line 1: feature_stats' noise_multiplier must be a number > 0")
    if not (_number(plan["sensitivity_units"]) and plan["sensitivity_units"] > 0):
        raise LedgerError("line 1: feature_stats' sensitivity_units must be a number > 0")
    if not (_is_int(plan["features"]) and plan["features"] >= 1):
        raise LedgerError("line 1: feature_stats' features must be an integer >= 1")


def _number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check_clip(clip: Any, noise_multiplier: Any) -> None:
    """The header's clip rule: fixed with its C, or adaptive with both noises, which together
    must be no weaker than the one Gaussian of ``noise_multiplier`` the entries are accounted
    with (1 / z^2 >= 1 / z_update^2 + 1 / sigma_count^2, spgc.privacy.clipping)."""
    if not isinstance(clip, dict) or clip.get("rule") not in ("fixed", "adaptive", "decay"):
        raise LedgerError("line 1: clip must be {rule: fixed|adaptive|decay, ...}")
    if clip["rule"] == "fixed":
        if not _number(clip.get("clip_norm")):
            raise LedgerError("line 1: clip.clip_norm must be a number > 0")
        return
    if clip["rule"] == "decay":
        _decay_rule(clip)
        return
    keys = ("initial_norm", "learning_rate", "update_noise_multiplier", "count_noise_std")
    for key in (*keys, "target_quantile"):
        if not _number(clip.get(key)):
            raise LedgerError(f"line 1: clip.{key} must be a number > 0")
    if not (isinstance(noise_multiplier, (int, float)) and noise_multiplier > 0):
        raise LedgerError("line 1: adaptive clipping without noise (noise_multiplier 0)")
    pair = (clip["update_noise_multiplier"] ** -2 + clip["count_noise_std"] ** -2) ** -0.5
    if pair < noise_multiplier * (1 - 1e-9):
        raise LedgerError(
            f"line 1: the update's noise multiplier {clip['update_noise_multiplier']:.6g} and "
            f"the count's noise {clip['count_noise_std']:.6g} make a Gaussian of multiplier "
            f"{pair:.6g}, below the noise_multiplier {noise_multiplier:.6g} it is accounted with"
        )


def _check_security(header: Mapping[str, Any]) -> None:
    """The header's security: absent (semi-honest), or a level whose backend and mode have
    it (spgc.protocol.modes.MALICIOUS_VARIANTS)."""
    security = header.get("security", DEFAULT_SECURITY)
    if security not in SECURITY_NAMES:
        allowed = ", ".join(SECURITY_NAMES)
        raise LedgerError(f"line 1: security {security!r} is not one of {allowed}")
    if security == "malicious":
        problem = malicious_refusal(str(header.get("backend")), str(header.get("mode")))
        if problem is not None:
            raise LedgerError(f"line 1: {problem}")


def _check_noise_floor(floor: Any, noise_multiplier: Any) -> None:
    """The header's noise_floor: absent, or {"fraction": f in (0, 1), "coordinates": d >= 1}
    on a plan with noise."""
    if floor is None:
        return
    if not isinstance(floor, dict) or set(floor) != {"fraction", "coordinates"}:
        raise LedgerError('line 1: noise_floor must be {"fraction": f, "coordinates": d}')
    f, d = floor["fraction"], floor["coordinates"]
    if not (_number(f) and 0 < f < 1) or not (_is_int(d) and d >= 1):
        raise LedgerError(f"line 1: noise_floor {floor}: fraction in (0, 1), coordinates >= 1")
    if not (_number(noise_multiplier) and noise_multiplier > 0):
        raise LedgerError("line 1: a noise_floor without noise (noise_multiplier 0)")


def _release_clip_norm(number: int, entry: Mapping[str, Any], clip: Mapping[str, Any]) -> float:
    """A release entry's clip norm: the header's with a fixed rule, any C > 0 with adaptive
    clipping (the accounting does not depend on it: every row is bounded in units)."""
    value = entry.get("clip_norm")
    if not _number(value):
        raise LedgerError(f"line {number}: clip_norm must be a number > 0")
    if clip["rule"] == "fixed" and value != clip["clip_norm"]:
        raise LedgerError(f"line {number}: clip_norm {value} is not the header's fixed clip norm")
    if clip["rule"] == "decay":
        r = entry.get("round")
        if not _is_int(r) or r < 0:
            raise LedgerError(f"line {number}: round must be an integer >= 0")
        want = _decay_rule(clip).norm_at(r)
        if value != want:
            raise LedgerError(
                f"line {number}: clip_norm {value} is not the decay rule's {want} for round "
                f"{entry.get('round')}"
            )
    return float(value)


def _decay_rule(clip: Mapping[str, Any]) -> DecayClip:
    """The header's decay rule; LedgerError when its fields are malformed."""
    try:
        return DecayClip(float(clip["initial_norm"]), float(clip["rate"]), float(clip["floor"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"line 1: clip (decay) is malformed: {exc}") from None


def _servers(mode: Any) -> int:
    try:
        return get_mode(str(mode)).servers
    except ValueError:
        raise LedgerError(f"line 1: unknown mode {mode!r}") from None


def _hex_bytes(value: Any) -> bytes:
    try:
        return bytes.fromhex(str(value))
    except ValueError:
        return b""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _above(a: float | None, b: float | None, tolerance: float = 0.0) -> bool:
    """a > b + tolerance, where None stands for an infinite epsilon."""
    if b is None:
        return False
    if a is None:
        return True
    return a > b + tolerance


def _reaccount(header: Mapping[str, Any], steps: int, stats_releases: int = 0) -> float | None:
    """Epsilon after ``steps`` steps under the header's plan and ``stats_releases`` releases
    of the feature statistics, composed unsampled (None without noise)."""
    nm = header.get("noise_multiplier") or 0.0
    try:
        if nm <= 0:
            return None
        if header.get("noise_floor") is not None:  # the plan's figure: one curious server
            epsilon = (floor_epsilons(header, steps) or {}).get("curious_server")
            return math.inf if epsilon is None else epsilon
        sampling = dict(header.get("sampling") or {})
        unsampled = (
            [float(header["feature_stats"]["noise_multiplier"])] * stats_releases
            if stats_releases
            else []
        )
        acc = PrivacyAccountant(
            float(nm),
            float(header["delta"]),
            method=header.get("accountant", "rdp"),
            unsampled=unsampled,
            **sampling,
        )
        epsilon = acc.epsilon_after(steps)
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"line 1: the header's plan cannot be re-accounted: {exc}") from None
    return epsilon
