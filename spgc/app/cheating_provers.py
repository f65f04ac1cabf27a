"""Provers that cheat: what a provider with its own real keys, who has read our code and knows
every public value, can send to get a vector over the norm bound into the sum (issue 44).

Each kind adapts to the check it targets; the servers must refuse every one, each for its own
reason (tests/library/protocol/test_norm_proof.py at the unit level, ``spgc bench load --poison``
through the
real daemons, which names each kind's attempts and acceptances in its JSON):

- ``solve``: the attack an outside review found in the first protocol. It shares a vector 1,000
  times over the bound and fills the appended values with field elements (not bits) that make
  every linear check hold exactly (V0 + U0 = B^2, V_k = <z_k, x> + lw); then it cancels the
  quadratic combination with two values that solve a quadratic equation mod p
  (:func:`solve_appended_values`), for the weights rho that the values it has committed give.
  The weights come from J2, a hash of its share of those very values, so the solved values give
  new weights: refused, "the squared norm or a bit check does not hold".
- ``nonbits``: the linear checks alone satisfied with non-bits: refused for the bit checks.
- ``grind``: ``solve``, re-shared up to ``tries`` times until the weights of the values it sends
  cancel (probability p^-k a try); then sends its last try.
- ``wrap``: a vector whose squared norm wraps the field, with honest bits, re-shared up to
  ``tries`` times until every wraparound check passes (probability at most 2^-r a try).
- ``disagree``: H1 is sent a joint randomness part for another seed than the one H2 gets.
- ``replay``: a valid proof of an honest vector, made for another round (or run, or provider).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from spgc.protocol.norm_proof import (
    ANOTHER_CONTEXT,
    PARTS_DISAGREE,
    HelperShare,
    LeaderShare,
    NormProofParams,
    ProverSession,
    proof_context,
    prove,
    quadratic_residuals,
    wrapping_vector,
)

__all__ = [
    "CHEATS",
    "EXPECTED_REFUSAL",
    "GRIND_TRIES",
    "cheat",
    "cheat_kind",
    "forged_encoding",
    "over_the_bound",
    "solve_appended_values",
]

#: The kinds, in the order ``spgc bench load --poison`` takes them.
CHEATS = ("solve", "nonbits", "grind", "wrap", "disagree", "replay")
#: The reason the servers give each kind (spgc.protocol.norm_proof.decide): its own check catches
#: it.
EXPECTED_REFUSAL = {
    "solve": "the squared norm or a bit check does not hold",
    "nonbits": "the squared norm or a bit check does not hold",
    "grind": "the squared norm or a bit check does not hold",
    "wrap": "the norm bound or a wraparound check does not hold",
    "disagree": PARTS_DISAGREE,
    "replay": ANOTHER_CONTEXT,
}
#: How many times ``grind`` and ``wrap`` re-share by default.
GRIND_TRIES = 16

Shares = tuple[LeaderShare, HelperShare]


def cheat_kind(position: int, round_number: int, poisoners: int) -> str:
    """The kind the poisoner at ``position`` (of ``poisoners``) uses in a round: the poisoners
    of one round take consecutive kinds, the next round the kinds after them, so every kind is
    tried within ceil(6 / poisoners) rounds."""
    return CHEATS[(round_number * poisoners + position) % len(CHEATS)]


def over_the_bound(params: NormProofParams, honest: np.ndarray, factor: int = 1000) -> np.ndarray:
    """``factor`` times the honest vector, and at least 3 B in norm."""
    bad = np.asarray(honest, dtype=np.int64) * factor
    if float(np.linalg.norm(bad.astype(np.float64))) < 3.0 * params.bound:
        bad[0] = 3 * params.bound
    return bad


def _value(params: NormProofParams, bits: np.ndarray) -> int:
    p = params.p
    return sum(int(b) * pow(2, i, p) for i, b in enumerate(bits)) % p


def forged_encoding(params: NormProofParams, session: ProverSession) -> np.ndarray:
    """x, then appended values that make every linear check hold exactly for the shared x,
    whatever its norm: each value's lowest slot holds the whole value mod p (a non-bit where it
    does not fit), the other slots 0. z_k are known: J1 is fixed already."""
    p, d, b0, b1 = params.p, params.dim, params.norm_bits, params.window_bits
    w = session.encode(strict=False)
    assert w is not None
    xf = [int(v) % p for v in session.x]
    norm2 = sum(v * v for v in xf) % p
    appended = np.zeros(params.n_bits, dtype=np.uint64)
    appended[0] = norm2  # V0 = sum x_i^2 mod p
    appended[b0] = (params.bound**2 - norm2) % p  # U0 = B^2 - V0
    honest_bits = w[d + 2 * b0 :].reshape(params.repetitions, b1)
    dots = session.wraparound_dots()  # <z_k, x> mod p: public once J1 is
    for k in range(params.repetitions):
        # V_k as the honest encoder cut it, then the difference to <z_k, x> + lw in slot 0.
        target = (int(dots[k]) + params.window_offset) % p
        row = honest_bits[k].copy()
        row[0] = (int(row[0]) + target - _value(params, row)) % p
        appended[2 * b0 + k * b1 : 2 * b0 + (k + 1) * b1] = row
    return np.concatenate([w[:d], appended])


def _sqrt_mod(a: int, p: int) -> int | None:
    """A square root of a mod the prime p (Tonelli-Shanks), None for a non-residue."""
    a %= p
    if a == 0:
        return 0
    if pow(a, (p - 1) // 2, p) != 1:
        return None
    q, s = p - 1, 0
    while q % 2 == 0:
        q, s = q // 2, s + 1
    z = next(z for z in range(2, p) if pow(z, (p - 1) // 2, p) == p - 1)
    m, c, t, r = s, pow(z, q, p), pow(a, q, p), pow(a, (q + 1) // 2, p)
    while t != 1:
        i, t2 = 0, t
        while t2 != 1:
            t2, i = t2 * t2 % p, i + 1
        b = pow(c, 1 << (m - i - 1), p)
        m, c, t, r = i, b * b % p, t * b * b % p, r * b % p
    return r


def solve_appended_values(
    params: NormProofParams, w: np.ndarray, rhos: np.ndarray
) -> np.ndarray | None:
    """w with two slots of one wraparound value changed so that, for these weights, every
    quadratic combination is 0 and every linear check still holds: slot 0 moves by -2 delta and
    slot 1 by +delta (V_k unchanged), delta a root of the combination's quadratic equation mod
    p. One combination (k = 1) has a root for about half the slot pairs; with k >= 2 the k
    equations share a root only by chance. None when no pair has one."""
    p, d, b0, b1 = params.p, params.dim, params.norm_bits, params.window_bits
    w = np.asarray(w, dtype=np.uint64).copy()
    base = quadratic_residuals(params, w, rhos)
    for k in range(params.repetitions):
        j0 = 2 * b0 + k * b1  # index among the appended values
        a0, a1 = int(w[d + j0]), int(w[d + j0 + 1])
        # residual(delta) = base + r0 [(a0 - 2 delta)^2 - (a0 - 2 delta) - a0^2 + a0]
        #                        + r1 [(a1 + delta)^2 - (a1 + delta) - a1^2 + a1]
        r0, r1 = int(rhos[0][1 + j0]), int(rhos[0][1 + j0 + 1])
        qa = (4 * r0 + r1) % p
        qb = (r0 * (2 - 4 * a0) + r1 * (2 * a1 - 1)) % p
        qc = base[0] % p
        if qa == 0:
            continue
        root = _sqrt_mod(qb * qb - 4 * qa * qc, p)
        if root is None:
            continue
        delta = (-qb + root) * pow(2 * qa, p - 2, p) % p
        w[d + j0] = (a0 - 2 * delta) % p
        w[d + j0 + 1] = (a1 + delta) % p
        if all(v == 0 for v in quadratic_residuals(params, w, rhos)):
            return w
        w[d + j0], w[d + j0 + 1] = a0, a1  # k >= 2: this root cancels the first only
    return None


def _solve(bad: np.ndarray, params: NormProofParams, context: bytes) -> tuple[Shares, bool]:
    """One try of the solving forger; (shares, whether the values sent cancel their own
    weights, which is what acceptance would need)."""
    session = ProverSession(bad, params, context)
    draft = forged_encoding(params, session)
    session.commit(draft)  # the weights this forger can know: those of its draft
    solved = solve_appended_values(params, draft, session.rhos)
    if solved is not None:
        session.commit(solved)  # J2 now hashes the solved values: new weights
    cancels = all(v == 0 for v in quadratic_residuals(params, session.w, session.rhos))
    return session.finish(), cancels


def _wrap_try(params: NormProofParams, context: bytes) -> tuple[Shares, bool]:
    """One try of the wrapping vector with honest bits: passes if every V_k fits."""
    session = ProverSession(wrapping_vector(params, spread=params.dim // 2), params, context)
    w = session.encode(strict=True)
    fits = w is not None
    session.commit(w if fits else session.encode(strict=False))
    return session.finish(), fits


def _grind(one_try: Callable[[], tuple[Shares, bool]], tries: int) -> Shares:
    shares, ok = one_try()
    for _ in range(tries - 1):
        if ok:
            break
        shares, ok = one_try()
    return shares


def cheat(
    kind: str,
    honest: np.ndarray,
    params: NormProofParams,
    context: bytes,
    *,
    other_context: bytes | None = None,
    tries: int = GRIND_TRIES,
) -> Shares:
    """The two shares a ``kind`` cheater sends in place of the honest vector's, for the round
    whose proof context is ``context`` (``replay``: a valid proof made for ``other_context``,
    by default the next round's of another run)."""
    honest = np.asarray(honest, dtype=np.int64)
    bad = over_the_bound(params, honest)
    if kind == "solve":
        return _solve(bad, params, context)[0]
    if kind == "nonbits":
        session = ProverSession(bad, params, context)
        session.commit(forged_encoding(params, session))
        return session.finish()
    if kind == "grind":
        return _grind(lambda: _solve(bad, params, context), tries)
    if kind == "wrap":
        return _grind(lambda: _wrap_try(params, context), tries)
    if kind == "disagree":
        leader, helper = _solve(bad, params, context)[0]
        _, other = prove(np.zeros(params.dim, dtype=np.int64), params, context)
        # H2 expands another seed than the one whose part H1 was sent.
        return leader, HelperShare(other.seed, helper.leader_parts)
    if kind == "replay":
        made_for = other_context or proof_context("another run", 0, "another provider")
        clipped = honest
        norm = math.sqrt(float(np.dot(honest.astype(np.float64), honest.astype(np.float64))))
        if norm > params.bound:  # a replayed proof is a valid one: of a vector within bound
            clipped = np.trunc(honest * (params.bound / norm)).astype(np.int64)
        return prove(clipped, params, made_for)
    raise ValueError(f"unknown cheat {kind!r}; known: {', '.join(CHEATS)}")
