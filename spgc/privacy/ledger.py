"""The privacy ledger: one signed, hash-chained JSON line per noisy release, written before it.

Each server appends to ``ledger.jsonl`` in its state directory and fsyncs before anything
noisy leaves it (write-ahead), so after any crash the entries on disk are at least the
releases that may have happened; the accountant counts every ``release`` entry, whether its
round then completed, failed or was run again. The file verifies on its own: its first line
(``header``) names the run, the plan, this server's Ed25519 public key and, in the two-server
modes, the other server's; every line carries ``prev``, the SHA-256 of the line before it (the
chain), and ``sig``, the server's signature over the line without ``sig``. Every release entry
of a two-server run also carries ``peer_sig``, the other server's signature over the entry's
shared fields (:func:`release_statement`: the same bytes on both servers), exchanged before the
release (the Peer service's CosignRelease): neither server runs a release the other has not
recorded and signed. A finished run ends with a co-signed ``close`` entry (CloseLedger).
:func:`verify_ledger` checks the chain and both signatures and re-accounts epsilon from the
entries with dp-accounting, independently of the server's count.

Line kinds:

- ``header``: ``run_id``, ``server`` (its role, ``h1`` or ``h2``), ``public_key`` (hex, raw
  Ed25519), ``peer`` and ``peer_public_key`` (the other server; null in the one-server modes),
  the plan: every field re-accounting reads (:data:`PLAN_KEYS`: ``mode``, ``plan_sha256``,
  ``noise_multiplier``, ``sampling``, ``accountant``, ``delta``, ``sensitivity_units``,
  ``max_batch_size``, ``clip``: ``{"rule": "fixed", "clip_norm": C}`` or, with adaptive
  clipping, ``{"rule": "adaptive", "initial_norm", "target_quantile", "learning_rate",
  "update_noise_multiplier", "count_noise_std"}``: the pair of noises that ``noise_multiplier``
  accounts as one Gaussian, checked here to be no smaller than it, spgc.privacy.clipping),
  ``backend``
  and ``verify_inputs``; and where the plan has them (:data:`OPTIONAL_PLAN_KEYS`, co-signed
  the same way), ``feature_stats``, ``noise_floor`` and ``security`` (``"malicious"``; absent:
  semi-honest).
- ``release``: written BEFORE a release: the shared fields (:data:`STATEMENT_KEYS`): the
  header's plan fields, ``signers`` (role -> public key, both servers'), ``round``,
  ``noise_samples``, ``clip_norm`` (the round's C), ``index`` (0, 1, ...), ``epsilon_after``
  (the count at the plan's delta, this release included) and ``chain`` (the ledger head before
  it); ``time``; ``peer_sig`` (two-server modes).
  The feature statistics' release (``standardize: true``, spgc.privacy.feature_stats) is a
  release entry too, made once before the first step, with ``release``: ``"feature_stats"``
  in its statement; its header then names that release's plan, ``feature_stats``:
  ``{"noise_multiplier", "sensitivity_units", "features"}`` (co-signed with the plan), and
  re-accounting composes it, unsampled, with the steps.
- ``released``: written after it: ``index`` of its ``release``, ``round``, ``vector_sha256``.
- ``close``: the last line of a finished run (:data:`CLOSE_KEYS`): ``releases`` and ``chain``,
  the head after them: no release follows; ``peer_sig`` (two-server modes).
- ``abort``: the last line of a run this server stopped because the engine caught the peer
  deviating (issue 46, docs/MALICIOUS.md): :data:`ABORT_KEYS` (``round``, ``check``,
  ``evidence``, ``evidence_digest``) and ``time``, signed by this server alone (the peer it
  caught does not co-sign). No release follows it: this server co-signs none after it. The
  aborted round's release entry, written before its circuit ran, stays counted; no
  ``released`` line follows it.

The ledger head. The co-signed statements chain: the head before the first release is
:func:`plan_digest` of the header (so the header is its preimage), and the head after each
release the SHA-256 of its statement (:func:`chain_after`), which the next statement names.
Every published model names the head it depends on (release count and hash), and
:func:`spgc.privacy.ledger_pair.check_covers` holds a verified ledger to it.

What a dishonest server cannot do. Every field that re-accounting reads is in the statement
both servers sign for every release, and each release entry must repeat its header's fields:
a server that edits its header (a larger delta, another accountant or backend) and re-signs its
file with its own key breaks the peer's signature on every release entry. The statement also
names both servers' keys by role, so a ledger cannot present its own key as the peer's, and the
head before it, so no co-signed entry can be dropped, moved or renumbered. What a ledger that
is not closed cannot show: that no release followed its last entry (a cut-off copy is a valid
prefix); a model's head, or the co-signed closing entry, can.
:func:`spgc.privacy.ledger_pair.compare_ledgers` holds the two servers' ledgers to each other.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from spgc.common.logs import printable
from spgc.privacy.ledger_format import (
    ABORT_KEYS,
    EVIDENCE_KINDS,
    FORMAT,
    MAX_CHECK_CHARS,
    LedgerError,
    _cut_torn_tail,
    _sha256,
    _write_whole_line,
    aside_path,
    canonical,
    chain_after,
    close_statement,
    is_sha256_hex,
    plan_digest,
    public_key_hex,
    read_ledger_lines,
    release_statement,
    statement_bytes,
    verify_statement,
)
from spgc.privacy.ledger_verify import (
    verify_ledger,
)

__all__ = ["Ledger"]


@dataclass
class Ledger:
    """One server's ledger file (``path``; None: in memory only, nothing survives the
    process). Opening an existing file continues it (same run) after verifying it."""

    path: Path | None
    key: Ed25519PrivateKey
    header: dict[str, Any]
    lines: list[bytes] = field(default_factory=list)
    _releases: int | None = field(default=None, init=False, repr=False, compare=False)
    _head: str | None = field(default=None, init=False, repr=False, compare=False)
    _closed: bool = field(default=False, init=False, repr=False, compare=False)
    _aborted: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def open(cls, path: Path | None, key: Ed25519PrivateKey, header: Mapping[str, Any]) -> Ledger:
        """Continue the ledger at ``path`` if it holds this run (its header's run_id and
        plan), else start one with ``header`` (an older run's file is kept aside as
        ``ledger.jsonl.<run_id>``)."""
        fields = {**header, "kind": "header", "format": FORMAT, "public_key": public_key_hex(key)}
        if fields.get("peer_public_key") == fields["public_key"]:
            raise LedgerError("the peer server's ledger key is this server's own")
        ledger = cls(path, key, dict(fields))
        if path is not None and path.exists():
            _cut_torn_tail(path)
            existing = read_ledger_lines(path)
            if existing:
                try:
                    first = json.loads(existing[0])
                except ValueError:
                    first = None
                if not isinstance(first, dict):
                    raise LedgerError(f"{path}: line 1 is not a ledger header; not touching it")
                same = first.get("run_id") == fields.get("run_id") and first.get(
                    "plan_sha256"
                ) == fields.get("plan_sha256")
                if same:
                    try:
                        verify_ledger(existing)  # a damaged ledger is never extended
                    except LedgerError as exc:
                        raise LedgerError(f"{path}: {exc}; not extending it") from None
                    ledger.header = first
                    ledger.lines = existing
                    if (abort := ledger.aborted) is not None:
                        raise LedgerError(
                            f"{path}: this run was aborted at round {abort.get('round')} (the "
                            "peer deviated): it cannot be continued; start a new run "
                            "(resume: false)"
                        )
                    if first.get("public_key") != fields["public_key"]:
                        raise LedgerError(
                            f"{path}: written with another signing key; configure the same "
                            "ledger_key to continue this run"
                        )
                    if first.get("peer_public_key") != fields.get("peer_public_key"):
                        raise LedgerError(
                            f"{path}: this run's ledger names another signing key for the "
                            f"peer server {first.get('peer')!r} than the one it now presents"
                        )
                    return ledger
                path.replace(aside_path(path, str(first.get("run_id") or "old")))
        ledger._append(dict(fields))
        return ledger

    @property
    def releases(self) -> int:
        """How many release entries the ledger holds (what the accountant counts)."""
        if self._releases is None:  # counted once, then kept up to date by _append
            self._scan()
        assert self._releases is not None
        return self._releases

    @property
    def head(self) -> str:
        """The ledger head: :func:`plan_digest` of the header, then the hash of the last
        co-signed release statement (what the next release statement names as ``chain``)."""
        if self._head is None:
            self._scan()
        assert self._head is not None
        return self._head

    @property
    def closed(self) -> bool:
        """Whether the run's closing entry is written (nothing follows it)."""
        if self._releases is None:
            self._scan()
        return self._closed

    @property
    def aborted(self) -> dict[str, Any] | None:
        """The run's abort entry (this server caught the peer deviating), None if none."""
        if self._releases is None:
            self._scan()
        return self._aborted

    def _scan(self) -> None:
        self._releases, self._head, self._closed = 0, plan_digest(self.header), False
        self._aborted = None
        for line in self.lines[1:]:
            entry = json.loads(line)
            if entry.get("kind") == "release":
                self._releases += 1
                self._head = chain_after(entry)
            elif entry.get("kind") == "close":
                self._closed = True
            elif entry.get("kind") == "abort":
                self._aborted = entry

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry["prev"] = _sha256(self.lines[-1]) if self.lines else None
        entry.pop("sig", None)
        entry["sig"] = self.key.sign(canonical(entry)).hex()
        line = canonical(entry)
        if self.path is not None:
            # Durable before the caller goes on: O_APPEND + fsync of the file (and of the
            # directory when the file is new, so the entry survives a crash).
            new = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                _write_whole_line(fd, line + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                dfd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        if entry.get("kind") == "release":
            self._releases, self._head = self.releases + 1, chain_after(entry)
        elif entry.get("kind") == "close":
            self._closed = True
        elif entry.get("kind") == "abort":
            self._aborted = entry
        self.lines.append(line)
        return entry

    def _release_fields(
        self,
        round_number: int,
        noise_samples: int,
        clip_norm: float,
        epsilon_after: float,
        release: str | None = None,
    ) -> dict[str, Any]:
        if self.closed:
            raise LedgerError(f"round {round_number}: this run's ledger is closed: no release")
        if self.aborted is not None:
            raise LedgerError(f"round {round_number}: this run was aborted: no release")
        return release_statement(
            self.header,
            round_number,
            noise_samples,
            clip_norm,
            index=self.releases,
            epsilon_after=epsilon_after,
            chain=self.head,
            release=release,
        )

    def statement(
        self,
        round_number: int,
        noise_samples: int,
        clip_norm: float,
        epsilon_after: float,
        release: str | None = None,
    ) -> tuple[bytes, bytes]:
        """(statement, this server's signature over it) for the next release, of
        ``round_number`` (running epsilon ``epsilon_after``; ``release``: see
        :func:`release_statement`): what the peer server checks and co-signs
        (CosignRelease)."""
        data = statement_bytes(
            self._release_fields(round_number, noise_samples, clip_norm, epsilon_after, release)
        )
        return data, self.key.sign(data)

    def _with_peer_sig(self, entry: dict[str, Any], peer_sig: bytes | None, what: str) -> None:
        """Two-server runs (the header names a peer key) need ``peer_sig``, the other
        server's signature over the entry's statement, checked here."""
        peer_key = self.header.get("peer_public_key")
        if peer_key is not None:
            if peer_sig is None or not verify_statement(peer_key, statement_bytes(entry), peer_sig):
                raise LedgerError(
                    f"{what}: no valid signature of the peer server "
                    f"{self.header.get('peer')!r} over the entry"
                )
            entry["peer_sig"] = peer_sig.hex()
        elif peer_sig is not None:
            raise LedgerError("a one-server ledger takes no peer signature")

    def record_release(
        self,
        round_number: int,
        noise_samples: int,
        epsilon_after: float,
        peer_sig: bytes | None = None,
        *,
        clip_norm: float,
        release: str | None = None,
    ) -> int:
        """Write-ahead entry for one release (call it, then release). Returns its index.
        Two-server runs need ``peer_sig`` over :meth:`statement`."""
        entry = self._release_fields(round_number, noise_samples, clip_norm, epsilon_after, release)
        self._with_peer_sig(entry, peer_sig, f"round {round_number}")
        index = entry["index"]
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._append(entry)
        return index

    def close_statement(self) -> tuple[bytes, bytes]:
        """(statement, this server's signature) of the closing entry at the current head."""
        data = statement_bytes(close_statement(self.header, self.releases, self.head))
        return data, self.key.sign(data)

    def record_close(self, peer_sig: bytes | None = None) -> None:
        """The closing entry (two-server runs: co-signed, ``peer_sig`` over
        :meth:`close_statement`): the run ended, no release follows. Once only."""
        if self.closed:
            return
        if self.aborted is not None:
            raise LedgerError("this run was aborted (the peer deviated): no closing entry")
        entry = close_statement(self.header, self.releases, self.head)
        self._with_peer_sig(entry, peer_sig, "the closing entry")
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._append(entry)

    def record_released(self, index: int, round_number: int, vector_sha256: str) -> None:
        """What was released for entry ``index`` (the vector's SHA-256)."""
        self._append(
            {
                "kind": "released",
                "index": int(index),
                "round": int(round_number),
                "vector_sha256": vector_sha256,
            }
        )

    def record_abort(
        self, round_number: int, check: str, evidence: str, evidence_digest: str
    ) -> dict[str, Any]:
        """The run's abort entry: this server caught the peer deviating in round
        ``round_number`` (``check``: the engine's message; ``evidence``, one of
        :data:`EVIDENCE_KINDS`: what ``evidence_digest``, 64 hex characters, is the SHA-256
        of). Signed by this server alone; nothing follows it. Once only."""
        if self.aborted is not None:
            return self.aborted
        if self.closed:
            raise LedgerError("this run's ledger is closed: no abort entry")
        if evidence not in EVIDENCE_KINDS or not is_sha256_hex(evidence_digest):
            raise LedgerError(
                f"an abort's evidence is one of {EVIDENCE_KINDS} with a SHA-256 (64 hex "
                f"characters), got {evidence!r} {evidence_digest!r}"
            )
        check = printable(" ".join(str(check).split()), MAX_CHECK_CHARS)
        values = (int(round_number), check, evidence, evidence_digest.lower())
        entry: dict[str, Any] = {"kind": "abort", **dict(zip(ABORT_KEYS, values, strict=True))}
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self._append(entry)
