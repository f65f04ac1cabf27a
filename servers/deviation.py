"""A round whose engine caught the peer deviating: the abort (issue 46; docs/MALICIOUS.md,
"What must hold" 3).

Under ``security: malicious`` the engine checks what the peer sent before it opens anything,
and raises ``garbled_core.PeerDeviated`` when a check fails. The server that caught it then
stops the run: nothing of the round is released (its result never reaches the model update or
a ``released`` line), the evidence is kept (the engine's digest of everything the peer sent in
the run, else the SHA-256 of the check's message), and the abort goes into this server's own
ledger, signed by it alone (the peer will not co-sign). Earlier rounds stay counted, and so
does the aborted round's release entry, written before its circuit ran. Mode preprocessed's
pool production aborts the same way (its caught run stores no noise; :data:`NOISE_PRODUCTION`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from spgc.privacy.ledger_format import LedgerError, abort_line
from spgc.servers.errors import PeerDeviatedError

__all__ = [
    "NOISE_PRODUCTION",
    "abort_round",
    "evidence_of",
    "is_peer_notice",
    "peer_aborted",
    "peer_notice",
]

#: ``during`` of an abort caught while making mode preprocessed's noise pool.
NOISE_PRODUCTION = "noise production"


def evidence_of(link: Any, exc: BaseException) -> tuple[str, str]:
    """(what the digest is of, its SHA-256 in hex): ``transcript``, the link's digest of
    everything the peer sent in the engine's last run where its sessions keep one
    (:meth:`servers.gc_party.PartyLink.evidence_digest`), else ``message``, the SHA-256 of the
    check's message."""
    digest = getattr(link, "evidence_digest", None)
    transcript = digest() if callable(digest) else None
    if transcript:
        return "transcript", str(transcript).lower()
    return "message", hashlib.sha256(_check(exc).encode()).hexdigest()


def _check(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def abort_round(
    state: Any, link: Any, t: int, exc: BaseException, during: str = ""
) -> PeerDeviatedError:
    """This server caught the peer deviating in round t (``exc``: the engine's PeerDeviated):
    the abort entry in its ledger, the audit line, the run failed with the abort's line
    (providers are told), and the error to raise, which stops the server (no re-pairing).
    ``during``: what was running when not the round's own circuit ("noise production": mode
    preprocessed's pool, whose run stores nothing once caught), named in the entry's check."""
    evidence, digest = evidence_of(link, exc)
    check = f"{during}: {_check(exc)}" if during else _check(exc)
    abort = {"round": t, "check": check, "evidence": evidence, "evidence_digest": digest}
    message = abort_line(abort)
    try:
        state.record_abort(t, abort["check"], evidence, digest)
    except LedgerError as problem:  # the run stops all the same; say why it is not recorded
        message += f"; the ledger's abort entry was not written: {problem}"
    state.audit.record(
        "peer_deviated",
        round=t,
        reason=abort["check"],
        evidence=evidence,
        evidence_digest=digest,
    )
    state.aborted = message  # the peer's next call hears it (servers.peer)
    state.fail(message)  # the daemon logs it as it stops
    for lane in link.lanes() if hasattr(link, "lanes") else ():
        lane.interrupt()  # the peer's engine finds the link closed now, not at the daemon's stop
    return PeerDeviatedError(message)


_NOTICE = " aborted the run: its engine caught this server deviating: "


def peer_notice(role_name: str, aborted: str) -> str:
    """What the server that aborted (``role_name``) tells the other, whose messages failed the
    check: ``aborted`` is its abort line."""
    return f"{role_name}{_NOTICE}{aborted}"


def is_peer_notice(text: str) -> bool:
    """Whether a refusal's ``text`` is :func:`peer_notice`'s: the peer aborted the run on
    this server's messages (a refusal to say so, not a configuration that differs)."""
    head, found, _ = text.partition(_NOTICE)
    return bool(found) and head in ("h1", "h2")


def peer_aborted(state: Any, t: int, notice: str) -> str:
    """The peer told this server that it aborted the run at round t (``notice``: its words):
    audited, and the run fails with it (nothing of round t is released here either). The
    failure's line."""
    message = f"the peer stopped the run at round {t}: {notice}"
    state.audit.record("peer_aborted", round=t, reason=notice)
    state.fail(message)
    return message
