"""A provider's proof that its vector is within the plan's L2 norm bound, checked by the two
servers jointly on secret shares (issues 35 and 44; PINE, Rothblum, Omri, Chen and Talwar 2023,
on the fully linear proofs of Boneh, Boyle, Corrigan-Gibbs, Gilboa and Ishai, CRYPTO 2019).

What is proved. The provider's integer vector ``x`` (d coordinates, in units) is shared
additively over a prime field F_p: the leader (H1) receives its share in full, the helper (H2) a
32-byte seed that expands to its share, so the upload is one field element per coordinate plus
O(sqrt d) for the proof. The servers accept only if ``||x||_2^2 <= B^2`` over the integers
(``B``: the plan's bound in units), up to the soundness error
:attr:`NormProofParams.soundness_error`.

How. The provider appends values to ``x`` (the "encoded input" w, all of it shared):

- ``V0 = ||x||^2`` and ``U0 = B^2 - V0``, b0 bits each (b0 = bit length of B^2). The servers
  check ``sum x_i^2 = V0`` (quadratic: the proof) and ``V0 + U0 = B^2`` (linear). In the field
  that bounds the norm only if ``sum x_i^2`` does not wrap around p;
- the wraparound checks, r repetitions: ``z_k in {-1, 0, 1}^d`` (probabilities 1/4, 1/2, 1/4)
  drawn from J1, a hash of the context and of both servers' shares of x (Fiat-Shamir: z is
  drawn after x is fixed); the provider appends the b1 bits of ``V_k = <z_k, x> + lw`` and the
  servers check ``<z_k, x> + lw - V_k = 0`` (linear, on their shares). An honest vector has
  ``|<z_k, x>| <= alpha B`` except with probability ``2 exp(-alpha^2 / 2)`` (Hoeffding); a
  vector whose squared norm wraps the field passes each repetition with probability at most
  1/2 when ``p >= 81 H^2`` (H: the window's half-width; PINE, Lemma 4.3 and Claim 4.9);
- every appended entry is a bit: ``beta^2 - beta = 0`` (quadratic: the proof).

The coins, each drawn after every prover value it constrains (docs/PRIVACY.md, "Norm
proofs"):

- J1 = H(leader x-part, helper part): both parts hash the context (run, round, provider) and a
  server's whole share of x (H2's share is its seed); it gives the z_k, which constrain the
  bits appended after it;
- J2 = H(J1, leader bits-part): J2 also hashes H1's share of the appended values, so the whole
  encoded input w is fixed before J2; it gives the quadratic weights rho (k independent
  combinations, below), which the proof polynomials depend on;
- the query point t and the linear weights sigma: from the servers' round coin, drawn by both
  servers after their intake closed and never sent to a provider (servers.norm_checks).

The quadratic checks are combined k times: ``rho_c0 (sum x_i^2 - V0) + sum_j rho_cj
(beta_j^2 - beta_j)``, c < k, each proved with one fully linear proof: a ParallelSum of m
multiplication gadgets ``sum_l u_l a_l`` (u = rho_c * a) over M = N' - 1 calls, wire
polynomials through the N'-th roots of unity (N' a power of two; the 0th point holds a random
seed per wire, which makes the opened wire values uniform), and the proof polynomial
P_c = sum_l U_l A_l of degree <= 2(N' - 1). The servers open ``U_l(t), A_l(t), P_c(t)`` and
each combination's value, and a random combination of the linear checks, and accept if every
``sum_l U_l(t) A_l(t) = P_c(t)`` and every combination is 0.

Soundness error per proof (:attr:`NormProofParams.soundness_error`), for a vector over the
bound and a prover that evaluates the hash at most 2^G times (G = :data:`GRINDING_BITS`): J1
and J2 are hashes of the prover's own values, so it may try again, each try a fresh hash:
``2^G 2^-r`` (the wraparound checks, one chance per J1) + ``2^G p^-k`` (the k quadratic
combinations, one chance per J2) + ``k (2N' - 2) / (p - N')`` (the polynomial identities at t)
+ ``1/p`` (the linear combination). t and sigma are the servers' and cannot be ground.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from garbled_core import field_expand, field_matvec, field_mul, field_ntt, wraparound_dots

__all__ = [
    "DEFAULT_REPETITIONS",
    "GRINDING_BITS",
    "HelperShare",
    "LeaderShare",
    "NormField",
    "NormProofParams",
    "ProverSession",
    "VerifierMessage",
    "choose_field",
    "decide",
    "helper_query",
    "leader_query",
    "proof_context",
    "prove",
    "prove_unchecked",
    "quadratic_residuals",
    "share_dots",
    "wrapping_vector",
]

#: The prover's hash budget: the soundness error holds against a provider that evaluates
#: SHA-256 up to 2^GRINDING_BITS times (years of a GPU), re-sharing to draw new J1 and J2.
GRINDING_BITS = 64
#: The soundness target: at most 2^-SOUNDNESS_BITS per proof, four terms of at most
#: 2^-(SOUNDNESS_BITS + 2) each.
SOUNDNESS_BITS = 40
_TERM_BITS = SOUNDNESS_BITS + 2
#: Wraparound repetitions: each one a vector over the bound passes with probability <= 1/2, so
#: r = G + 42 leaves 2^-42 to a prover who tries 2^G values of J1.
DEFAULT_REPETITIONS = GRINDING_BITS + _TERM_BITS
#: Honest vectors fail a repetition with probability <= 2 exp(-alpha^2/2); alpha is set so that
#: all r repetitions pass but with probability 2^-COMPLETENESS_BITS.
COMPLETENESS_BITS = 50
MAX_FIELD_BITS = 62
#: At most this many quadratic combinations (p >= 2^44, so 3 give p^3 >= 2^(G + 42)).
MAX_COMBINATIONS = 3
_TAG = b"spgc-norm-proof/v2/"


def _h(label: str, *parts: bytes) -> bytes:
    """SHA-256 of the protocol tag, a label and length-prefixed parts (domain separated)."""
    h = hashlib.sha256(_TAG + label.encode())
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first 12 prime bases: deterministic below 3.3e24."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for q in bases:
        if n % q == 0:
            return n == q
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class NormField:
    """F_p with p = c 2^K + 1 and ``root``, a primitive 2^K-th root of unity."""

    p: int
    two_adicity: int
    root: int

    def root_of_unity(self, n: int) -> int:
        """A primitive n-th root of unity (n a power of two, at most 2^K)."""
        if n < 1 or n & (n - 1) or n.bit_length() - 1 > self.two_adicity:
            raise ValueError(f"no primitive {n}-th root of unity in this field")
        return pow(self.root, (1 << self.two_adicity) // n, self.p)

    def inv(self, a: int) -> int:
        return pow(a, self.p - 2, self.p)


def choose_field(min_value: int, two_adicity: int) -> NormField:
    """The smallest prime p = c 2^K + 1 >= min_value (K = ``two_adicity``), below 2^62.

    ValueError naming the limit when there is none."""
    limit = 1 << MAX_FIELD_BITS
    step = 1 << two_adicity
    c = max(1, -(-(min_value - 1) // step))
    while c * step + 1 < limit:
        p = c * step + 1
        if p >= min_value and _is_prime(p):
            # A quadratic non-residue h gives h^((p-1)/2^K), of order exactly 2^K.
            h = next(h for h in range(2, p) if pow(h, (p - 1) // 2, p) == p - 1)
            return NormField(p, two_adicity, pow(h, (p - 1) >> two_adicity, p))
        c += 1
    raise ValueError(
        f"no prime of the form c*2^{two_adicity}+1 between {min_value} and 2^{MAX_FIELD_BITS}: "
        "the norm bound is too large for a verified field; lower the scale, the batch size or "
        "the clip norm"
    )


def _alpha(repetitions: int) -> float:
    # r * 2 exp(-alpha^2 / 2) <= 2^-COMPLETENESS_BITS
    return math.sqrt(2.0 * math.log(2.0 * repetitions * 2.0**COMPLETENESS_BITS))


@dataclass(frozen=True)
class NormProofParams:
    """Everything a provider and both servers must agree on; :meth:`for_plan` derives it."""

    dim: int
    bound: int  # B, the L2 bound in units
    ring_bits: int
    repetitions: int
    norm_bits: int  # b0: V0 and U0 each
    window_bits: int  # b1: each wraparound result
    points: int  # N': the wire polynomials' interpolation points (a power of two)
    chunk: int  # m: multiplications per gadget call
    field: NormField
    combinations: int  # k: independent quadratic combinations, each with its own proof

    @classmethod
    def for_plan(
        cls, dim: int, bound: int, ring_bits: int, repetitions: int = DEFAULT_REPETITIONS
    ) -> NormProofParams:
        if dim < 1 or bound < 1 or repetitions < 1:
            raise ValueError("dim, bound and repetitions must be >= 1")
        norm_bits = (bound * bound).bit_length()
        half = math.ceil(_alpha(repetitions) * bound)
        # The window [-(2^(b1-1) - 1), 2^(b1-1)] holds [-half, half].
        window_bits = half.bit_length() + 1
        n_inputs = dim + 2 * norm_bits + repetitions * window_bits
        points, chunk = _chunking(n_inputs)
        min_p = max(
            81 * (1 << (2 * window_bits - 2)),  # PINE's p >= 81 H^2, H = 2^(b1-1)
            (1 << (norm_bits + 1)) + 1,  # V0 + U0 never wraps
            (1 << ring_bits) + 1,  # the sum's reconstruction (spgc.protocol.norm_proof docs)
            # the k polynomial identities' error k (2N' - 2) / (p - N') <= 2^-42
            (1 << _TERM_BITS) * MAX_COMBINATIONS * (2 * points + 2),
        )
        two_adicity = max(ring_bits, (2 * points).bit_length() - 1)
        field = choose_field(min_p, two_adicity)
        # p^k >= 2^(G + 42): a prover trying 2^G values of J2 zeroes all k with prob <= 2^-42.
        combinations = 1
        while field.p**combinations < 1 << (GRINDING_BITS + _TERM_BITS):
            combinations += 1
        return cls(
            dim, bound, ring_bits, repetitions, norm_bits, window_bits, points, chunk, field,
            combinations,
        )  # fmt: skip

    @property
    def p(self) -> int:
        return self.field.p

    @property
    def window_offset(self) -> int:
        """lw: V_k = <z_k, x> + lw lies in [0, 2^b1) for a passing repetition."""
        return (1 << (self.window_bits - 1)) - 1

    @property
    def n_bits(self) -> int:
        return 2 * self.norm_bits + self.repetitions * self.window_bits

    @property
    def n_inputs(self) -> int:
        """Length of the encoded input w: x, then V0's bits, U0's bits, each V_k's bits."""
        return self.dim + self.n_bits

    @property
    def calls(self) -> int:
        return self.points - 1

    @property
    def combination_proof_len(self) -> int:
        """One combination's proof: 2m wire seeds, then P's 2N' - 1 coefficients."""
        return 2 * self.chunk + 2 * self.points - 1

    @property
    def proof_len(self) -> int:
        """The k combinations' proofs, one after the other."""
        return self.combinations * self.combination_proof_len

    @property
    def verifier_len(self) -> int:
        """Per combination U_l(t), A_l(t) (2m), P(t) and its value; then the linear
        combination."""
        return self.combinations * (2 * self.chunk + 2) + 1

    @property
    def element_bytes(self) -> int:
        return (self.p.bit_length() + 7) // 8

    @property
    def soundness_error(self) -> float:
        """Probability that a vector over the bound is accepted (per proof, against a prover
        that evaluates the hash up to 2^GRINDING_BITS times; see the module)."""
        terms = self.soundness_terms
        return sum(terms.values())

    @property
    def soundness_terms(self) -> dict[str, float]:
        """The error's four terms, named by the coin each bounds (docs/PRIVACY.md)."""
        grind = 2.0**GRINDING_BITS
        return {
            "wraparound_z_from_j1": grind * 2.0**-self.repetitions,
            "quadratic_rho_from_j2": grind * float(self.p) ** -self.combinations,
            "query_point_t_servers": self.combinations
            * (2 * self.points - 2)
            / (self.p - self.points),
            "linear_sigma_servers": 1.0 / self.p,
        }

    @cached_property
    def _omega(self) -> int:
        return self.field.root_of_unity(self.points)


def _chunking(n_inputs: int) -> tuple[int, int]:
    """(N', m) with (N' - 1) m >= n_inputs, minimising the proof and the verifier message."""
    best: tuple[int, int, int] | None = None
    points = 2
    while points <= 1 << 22:
        chunk = -(-n_inputs // (points - 1))
        cost = (2 * chunk + 2 * points) + (2 * chunk + 2)
        if best is None or cost < best[0]:
            best = (cost, points, chunk)
        if chunk == 1:
            break
        points *= 2
    assert best is not None
    return best[1], best[2]


# ---- field helpers on numpy uint64 (values in [0, p), p < 2^62: sums of two never overflow)


def _to_field(x: np.ndarray, p: int) -> np.ndarray:
    """int64 values -> their residues in [0, p) (numpy's % is non-negative for p > 0)."""
    return np.mod(np.asarray(x, dtype=np.int64), np.int64(p)).astype(np.uint64)


def _add(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    s = a + b
    return np.where(s >= np.uint64(p), s - np.uint64(p), s)


def _sub(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    return np.where(a >= b, a - b, a + (np.uint64(p) - b))


def _sum_rows(m: np.ndarray, p: int) -> np.ndarray:
    """Column sums mod p of a (rows, n) array, by pairwise halving."""
    while m.shape[0] > 1:
        if m.shape[0] % 2:
            m = np.vstack([m, np.zeros((1, m.shape[1]), dtype=np.uint64)])
        m = _add(m[0::2], m[1::2], p)
    return m[0]


def _centered(v: int, p: int) -> int:
    return v - p if v > p // 2 else v


def _bits(value: int, width: int) -> np.ndarray:
    return np.array([(value >> i) & 1 for i in range(width)], dtype=np.uint64)


def _seed16(label: str, *parts: bytes) -> bytes:
    return _h(label, *parts)[:16]


def _random_elements(n: int, p: int) -> np.ndarray:
    """n uniform field elements from the OS CSPRNG (AES-CTR from a fresh 16-byte seed)."""
    return field_expand(os.urandom(16), n, p)


# ---- the messages and the joint randomness

PART_BYTES = 32


def proof_context(run_id: str, round_number: int, provider: str) -> bytes:
    """What one proof is for: the run, the round and the provider's identity (as the servers
    know it: its certificate's name, or provider_id with --insecure). Every joint randomness
    part hashes it, so a proof made for another run, round or provider is refused."""
    if not 0 <= round_number < 1 << 64:
        raise ValueError(f"round {round_number} outside 0..2^64-1")
    return _h("context", run_id.encode(), round_number.to_bytes(8, "little"), provider.encode())


def _vector_bytes(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values).astype("<u8").tobytes()


def _leader_x_part(context: bytes, blind: bytes, x_share: np.ndarray) -> bytes:
    return _h("leader-part", context, blind, _vector_bytes(x_share))


def _leader_bits_part(context: bytes, blind: bytes, bits_share: np.ndarray) -> bytes:
    return _h("leader-bits", context, blind, _vector_bytes(bits_share))


def _helper_part(context: bytes, seed: bytes) -> bytes:
    return _h("helper-part", context, seed)


def _joint_x(leader_x_part: bytes, helper_part: bytes) -> bytes:
    """J1: fixed once both servers' shares of x are; seeds the wraparound vectors."""
    return _h("joint", leader_x_part, helper_part)


def _joint_w(joint_x: bytes, leader_bits_part: bytes) -> bytes:
    """J2: fixed once the whole encoded input is; seeds the quadratic weights."""
    return _h("joint-bits", joint_x, leader_bits_part)


@dataclass(frozen=True)
class LeaderShare:
    """What H1 receives: its share of the encoded input and of the proof, in full."""

    inputs: np.ndarray  # uint64[n_inputs]
    proof: np.ndarray  # uint64[proof_len]
    blind: bytes  # 32 bytes: hides H1's shares inside its joint randomness parts
    helper_part: bytes  # 32 bytes: H2's joint randomness part, as the provider computed it

    def parts(self, params: NormProofParams, context: bytes) -> bytes:
        """H1's own parts (x-part then bits-part), from its shares and the context."""
        x_part = _leader_x_part(context, self.blind, self.inputs[: params.dim])
        return x_part + _leader_bits_part(context, self.blind, self.inputs[params.dim :])


@dataclass(frozen=True)
class HelperShare:
    """What H2 receives: a seed its shares expand from, and H1's two joint randomness parts
    (x-part then bits-part, 64 bytes) as the provider computed them."""

    seed: bytes  # 32 bytes from the OS CSPRNG
    leader_parts: bytes  # 64 bytes

    def expand(self, params: NormProofParams) -> tuple[np.ndarray, np.ndarray]:
        inputs = field_expand(_seed16("helper-inputs", self.seed), params.n_inputs, params.p)
        proof = field_expand(_seed16("helper-proof", self.seed), params.proof_len, params.p)
        return inputs, proof

    def part(self, context: bytes) -> bytes:
        """H2's own part, from its seed and the context."""
        return _helper_part(context, self.seed)


@dataclass(frozen=True)
class VerifierMessage:
    """One server's share of the verification for one provider; the two are summed.
    ``parts``: the three joint randomness parts in one order, H1's x-part, H1's bits-part, H2's
    part: those of this server computed by itself, the other server's as the provider sent
    them, so that :func:`decide` can say which of them disagree."""

    values: np.ndarray  # uint64[verifier_len]
    joint_seed: bytes  # J2 as this server derived it: both must be equal
    leader: bool  # H1's message (else H2's)
    parts: bytes  # 96 bytes: H1's x-part, H1's bits-part, H2's part


# ---- the provider's side


def _rhos(params: NormProofParams, joint_w: bytes) -> np.ndarray:
    """(k, 1 + n_bits): per combination rho_0 (for sum x^2 - V0), then one per appended bit."""
    return np.stack(
        [
            field_expand(
                _seed16("rho", joint_w, c.to_bytes(4, "little")), 1 + params.n_bits, params.p
            )
            for c in range(params.combinations)
        ]
    )


def _weights(params: NormProofParams, rhos: np.ndarray) -> np.ndarray:
    """The multiplier c_i of each input in u = c * a (one combination's rho)."""
    w = np.empty(params.n_inputs, dtype=np.uint64)
    w[: params.dim] = rhos[0]
    w[params.dim :] = rhos[1:]
    return w


def _wire_values(
    params: NormProofParams, a: np.ndarray, rhos: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    """(2m, N') values of one combination's wire polynomials at the roots of unity: column 0
    the seeds, column k the k-th gadget call's inputs (u rows first, then a rows), zero past
    the input."""
    m, n = params.chunk, params.points
    padded = np.zeros(m * params.calls, dtype=np.uint64)
    padded[: params.n_inputs] = a
    u = np.zeros_like(padded)
    u[: params.n_inputs] = field_mul(a, _weights(params, rhos), params.p)
    w = np.empty((2 * m, n), dtype=np.uint64)
    w[:, 0] = seeds
    w[:m, 1:] = u.reshape(params.calls, m).T
    w[m:, 1:] = padded.reshape(params.calls, m).T
    return w


def _encode(
    params: NormProofParams, x: np.ndarray, joint_x: bytes, strict: bool = True
) -> np.ndarray | None:
    """The encoded input w (field elements) under J1. strict: None if a wraparound check fails
    (an honest vector: probability <= 2^-50; the caller re-shares and tries again). Not strict
    (a dishonest provider's first draft): every value is cut to its bits, so what does not fit
    is misrepresented and the servers' checks catch it."""
    p = params.p
    xf = _to_field(x, p)
    norm2 = int(field_matvec(xf[None, :], xf, p)[0])
    dots = wraparound_dots(xf, _seed16("wraparound", joint_x), params.repetitions, p)
    lw, top = params.window_offset, (1 << params.window_bits) - 1
    b0 = params.norm_bits
    mask0 = (1 << b0) - 1
    parts = [xf, _bits(norm2 & mask0, b0), _bits((params.bound**2 - norm2) % p & mask0, b0)]
    for d in dots:
        v = _centered(int(d), p) + lw
        if not 0 <= v <= top:
            if strict:
                return None
            v = min(max(v, 0), top)
        parts.append(_bits(v, params.window_bits))
    return np.concatenate(parts)


def _prove_polynomial(params: NormProofParams, w: np.ndarray) -> np.ndarray:
    """P's 2N' - 1 coefficients from one combination's wire values w (2m, N')."""
    p, n = params.p, params.points
    omega = params._omega
    coeffs = field_ntt(w, p, params.field.inv(omega))
    coeffs = field_mul(coeffs.ravel(), np.array([params.field.inv(n)], dtype=np.uint64), p)
    wide = np.zeros((w.shape[0], 2 * n), dtype=np.uint64)
    wide[:, :n] = coeffs.reshape(w.shape)
    omega2 = params.field.root_of_unity(2 * n)
    evals = field_ntt(wide, p, omega2)
    m = params.chunk
    prods = field_mul(evals[:m].ravel(), evals[m:].ravel(), p).reshape(m, 2 * n)
    p_evals = _sum_rows(prods, p)
    p_coeffs = field_ntt(p_evals[None, :], p, params.field.inv(omega2))[0]
    p_coeffs = field_mul(p_coeffs, np.array([params.field.inv(2 * n)], dtype=np.uint64), p)
    if p_coeffs[-1] != 0:
        raise AssertionError("proof polynomial of degree 2N' - 1: the wire layout is wrong")
    return p_coeffs[:-1]


class ProverSession:
    """One proof, in protocol order; each coin exists only once the values it constrains are
    fixed:

    1. ``ProverSession(x, params, context)``: H2's seed, H1's share of x and its blind are
       drawn; J1 (:attr:`joint_x`) hashes both servers' shares of x;
    2. :meth:`commit` (w): the encoded input, x then the appended values made under J1, is
       fixed; J2 (:attr:`joint_w`) hashes H1's share of the appended values, and gives the
       quadratic weights :attr:`rhos`;
    3. :meth:`finish`: the proofs, for those weights; the two shares.

    :func:`prove` runs it for an honest vector; tests and ``spgc bench load --poison`` run it
    as a dishonest provider would (spgc.app.cheating_provers)."""

    def __init__(self, x: np.ndarray, params: NormProofParams, context: bytes) -> None:
        self.params, self.context = params, context
        p, d = params.p, params.dim
        self.x = np.asarray(x, dtype=np.int64)
        self.seed = os.urandom(32)
        self._helper_inputs, self._helper_proof = HelperShare(self.seed, b"").expand(params)
        self.leader_x = _sub(_to_field(self.x, p), self._helper_inputs[:d], p)
        self.blind = os.urandom(32)
        self.leader_x_part = _leader_x_part(context, self.blind, self.leader_x)
        self.helper_part = _helper_part(context, self.seed)
        self.joint_x = _joint_x(self.leader_x_part, self.helper_part)
        self.w: np.ndarray | None = None

    def encode(self, strict: bool = True) -> np.ndarray | None:
        """The honest encoded input of x under J1 (strict: None if a check fails)."""
        return _encode(self.params, self.x, self.joint_x, strict)

    def wraparound_dots(self) -> np.ndarray:
        """<z_k, x> mod p for k < r: public once J1 is."""
        params = self.params
        xf = _to_field(self.x, params.p)
        seed = _seed16("wraparound", self.joint_x)
        return wraparound_dots(xf, seed, params.repetitions, params.p)

    def commit(self, w: np.ndarray) -> None:
        """Fix the encoded input (its first d values must be x mod p: the x shares are fixed
        already); J2 and the weights follow from it."""
        params, p = self.params, self.params.p
        w = np.asarray(w, dtype=np.uint64)
        if w.shape != (params.n_inputs,) or (w.size and int(w.max()) >= p):
            raise ValueError("the encoded input must be n_inputs field elements")
        if not np.array_equal(w[: params.dim], _to_field(self.x, p)):
            raise ValueError("the encoded input must begin with the shared vector")
        self.w = w
        self.leader_bits = _sub(w[params.dim :], self._helper_inputs[params.dim :], p)
        self.leader_bits_part = _leader_bits_part(self.context, self.blind, self.leader_bits)
        self.joint_w = _joint_w(self.joint_x, self.leader_bits_part)
        self.rhos = _rhos(params, self.joint_w)

    def finish(self) -> tuple[LeaderShare, HelperShare]:
        """The proofs for the committed encoded input, and the two servers' shares."""
        if self.w is None:
            raise RuntimeError("commit the encoded input first")
        params, p = self.params, self.params.p
        proofs = []
        for rhos in self.rhos:
            seeds = _random_elements(2 * params.chunk, p)
            wires = _wire_values(params, self.w, rhos, seeds)
            proofs += [seeds, _prove_polynomial(params, wires)]
        proof = np.concatenate(proofs)
        inputs = np.concatenate([self.leader_x, self.leader_bits])
        leader = LeaderShare(
            inputs, _sub(proof, self._helper_proof, p), self.blind, self.helper_part
        )
        helper = HelperShare(self.seed, self.leader_x_part + self.leader_bits_part)
        return leader, helper


def quadratic_residuals(params: NormProofParams, w: np.ndarray, rhos: np.ndarray) -> list[int]:
    """Each combination's value ``rho_0 (sum x_i^2 - V0) + sum_j rho_j (beta_j^2 - beta_j)``
    for the encoded input w: all 0 for an honest one. What a cheating prover checks before it
    sends (spgc.app.cheating_provers), and what the servers' opened combinations equal."""
    p, d, b0 = params.p, params.dim, params.norm_bits
    w = np.asarray(w, dtype=np.uint64)
    x, bits = w[:d], w[d:]
    norm2 = _dot(x, x, p)
    v0 = _dot(bits[:b0], _powers(2, b0, p), p)
    sq_minus = _sub(field_mul(bits, bits, p), bits, p)
    return [(int(r[0]) * ((norm2 - v0) % p) + _dot(sq_minus, r[1:], p)) % p for r in rhos]


def prove(
    x: np.ndarray, params: NormProofParams, context: bytes, max_tries: int = 4
) -> tuple[LeaderShare, HelperShare]:
    """Share the integer vector ``x`` (int64, ``||x||_2 <= B``) with its norm proof, for
    ``context`` (:func:`proof_context`).

    ValueError if x has the wrong length or is over the bound (the provider's own bug: an
    honest encoder never produces one)."""
    x = _check_vector(x, params)
    xo = x.astype(object)
    norm2 = int(np.dot(xo, xo))  # exact (Python integers)
    if norm2 > params.bound**2:
        raise ValueError(
            f"||x||^2 = {norm2} exceeds the bound B^2 = {params.bound**2}: not clipped"
        )
    for _ in range(max_tries):
        session = ProverSession(x, params, context)
        w = session.encode(strict=True)
        if w is not None:
            session.commit(w)
            return session.finish()
    raise ValueError(f"the wraparound checks failed {max_tries} times: x is not within the bound")


EncodedEdit = Callable[[np.ndarray, "ProverSession"], np.ndarray]


def prove_unchecked(
    x: np.ndarray, params: NormProofParams, context: bytes, edit: EncodedEdit | None = None
) -> tuple[LeaderShare, HelperShare]:
    """What a dishonest provider running this code can send for any integer vector: the bits
    it cannot represent are cut, and ``edit(w, session)`` may rewrite the appended values (it
    sees every coin drawn so far: J1 and the z_k) before they are committed. For tests and
    ``spgc bench load --poison``; the servers must refuse every such share whose vector is
    over the bound."""
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.shape != (params.dim,):
        raise ValueError(f"expected an integer vector of length {params.dim}, got {x.shape}")
    session = ProverSession(x.astype(np.int64), params, context)
    w = session.encode(strict=False)
    assert w is not None
    if edit is not None:
        w = np.asarray(edit(w.copy(), session), dtype=np.uint64)
    session.commit(w)
    return session.finish()


def wrapping_vector(params: NormProofParams, spread: int = 0) -> np.ndarray:
    """Integers whose squared norm is p + s with 0 <= s <= B^2/2: in the field the norm
    equation holds (V0 = s), so only the wraparound checks can catch it (tests, bench load).
    The first ``spread`` coordinates carry equal magnitudes (alternating signs), the rest are
    filled greedily; ValueError if the vector is too short for it."""
    p, b2 = params.p, params.bound**2
    x = np.zeros(params.dim, dtype=np.int64)
    rest = p + b2 // 2
    spread = min(spread, params.dim - 1)
    if spread > 0:
        v = math.isqrt(rest // (spread + 1))
        x[:spread] = v
        x[1:spread:2] *= -1
        rest -= spread * v * v
    for i in range(max(spread, 0), params.dim):
        x[i] = math.isqrt(rest)
        rest -= int(x[i]) ** 2
    if not 0 <= rest <= b2 // 2:
        raise ValueError(f"{params.dim} coordinates cannot make a wrapping vector")
    return x


def _check_vector(x: np.ndarray, params: NormProofParams) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.shape != (params.dim,):
        raise ValueError(f"expected an integer vector of length {params.dim}, got {x.shape}")
    if x.size and int(np.abs(x.astype(np.int64)).max()) > params.bound:
        raise ValueError(f"a coordinate exceeds the norm bound {params.bound}")
    return x.astype(np.int64)


# ---- the servers' side


def _query_point(params: NormProofParams, verify_seed: bytes, joint: bytes) -> int:
    """t: uniform over the field minus the N'-th roots of unity, from the servers' seed."""
    p, n = params.p, params.points
    counter = 0
    while True:
        seed = _seed16("query", verify_seed, joint, counter.to_bytes(4, "little"))
        t = int(field_expand(seed, 1, p)[0])
        if pow(t, n, p) != 1:
            return t
        counter += 1


def _powers(base: int, count: int, p: int) -> np.ndarray:
    """[1, base, base^2, ...] (count values), by doubling: log2(count) vector products."""
    out = np.ones(max(count, 1), dtype=np.uint64)
    if count > 1:
        out[1] = base
    filled, step = min(count, 2), base * base % p
    while filled < count:
        take = min(filled, count - filled)
        out[filled : filled + take] = field_mul(out[:take], np.array([step], np.uint64), p)
        filled += take
        step = step * step % p
    return out[:count]


def _lagrange_at(params: NormProofParams, t: int) -> np.ndarray:
    """lambda_k(t) = w^k (t^N' - 1) / (N' (t - w^k)) for the N'-th roots of unity w^k."""
    p, n = params.p, params.points
    common = (pow(t, n, p) - 1) * params.field.inv(n) % p
    pts = _powers(params._omega, n, p)
    diffs = [(t - int(w)) % p for w in pts]
    # Batch inversion: one exponentiation for all N' denominators.
    prefix = [1] * (n + 1)
    for k, d in enumerate(diffs):
        prefix[k + 1] = prefix[k] * d % p
    inv_all = params.field.inv(prefix[n])
    inverses = [0] * n
    for k in range(n - 1, -1, -1):
        inverses[k] = inv_all * prefix[k] % p
        inv_all = inv_all * diffs[k] % p
    scaled = field_mul(pts, np.array([common], dtype=np.uint64), p)
    return field_mul(scaled, np.array(inverses, dtype=np.uint64), p)


def _dot(a: np.ndarray, b: np.ndarray, p: int) -> int:
    return int(field_matvec(np.ascontiguousarray(a)[None, :], np.ascontiguousarray(b), p)[0])


def _query(
    params: NormProofParams,
    leader: bool,
    inputs: np.ndarray,
    proof: np.ndarray,
    joint_x: bytes,
    joint_w: bytes,
    verify_seed: bytes,
    dots: np.ndarray | None = None,
) -> np.ndarray:
    p, m, n, d = params.p, params.chunk, params.points, params.dim
    if inputs.shape != (params.n_inputs,) or proof.shape != (params.proof_len,):
        raise ValueError("share of the wrong length")
    if (inputs.size and int(inputs.max()) >= p) or (proof.size and int(proof.max()) >= p):
        raise ValueError("share holds a value outside the field")
    t = _query_point(params, verify_seed, joint_w)
    lagrange = _lagrange_at(params, t)
    b0, b1, r = params.norm_bits, params.window_bits, params.repetitions
    bits = inputs[d:]
    v0 = _dot(bits[:b0], _powers(2, b0, p), p)
    u0 = _dot(bits[b0 : 2 * b0], _powers(2, b0, p), p)
    vk = field_matvec(np.ascontiguousarray(bits[2 * b0 :].reshape(r, b1)), _powers(2, b1, p), p)
    out = []
    size = params.combination_proof_len
    for c, rhos in enumerate(_rhos(params, joint_w)):
        part = proof[c * size : (c + 1) * size]
        wires = _wire_values(params, inputs, rhos, part[: 2 * m])
        f_t = field_matvec(wires, lagrange, p)
        coeffs = np.ascontiguousarray(part[2 * m :])
        p_t = _dot(coeffs, _powers(t, coeffs.size, p), p)
        # The gadget calls' sum: sum_{k=1..M} P(w^k) = N' (c_0 + c_N') - P(1).
        c_n = int(coeffs[n]) if n < coeffs.size else 0
        gadgets = (n * (int(coeffs[0]) + c_n) - _dot(coeffs, np.ones_like(coeffs), p)) % p
        quadratic = (gadgets - int(rhos[0]) * v0 - _dot(bits, rhos[1:], p)) % p
        out += [f_t, np.array([p_t, quadratic], dtype=np.uint64)]
    # Linear checks, combined with weights of the servers' choosing.
    sigma = field_expand(_seed16("sigma", verify_seed, joint_w), 1 + r, p)
    if dots is None or dots.shape != (r,):
        dots = _share_dots(params, inputs, joint_x)
    if leader:  # the constants enter one server's share only
        dots = _add(dots, np.full(r, params.window_offset, dtype=np.uint64), p)
        v0_check = (v0 + u0 - params.bound**2) % p
    else:
        v0_check = (v0 + u0) % p
    linear = (int(sigma[0]) * v0_check + _dot(_sub(dots, vk, p), sigma[1:], p)) % p
    out.append(np.array([linear], dtype=np.uint64))
    return np.concatenate(out)


#: A server's wraparound dots of a share by the proof's J1 (:func:`share_dots`), or None.
DotsLookup = Callable[[bytes], np.ndarray | None]


def _share_dots(params: NormProofParams, inputs: np.ndarray, joint_x: bytes) -> np.ndarray:
    """<z_k, x share> for the r wraparound checks: no coin enters, and for a large d they are
    most of a verifier message's work."""
    x = np.ascontiguousarray(inputs[: params.dim])
    return wraparound_dots(x, _seed16("wraparound", joint_x), params.repetitions, params.p)


def _leader_joint(
    params: NormProofParams, share: LeaderShare, context: bytes
) -> tuple[bytes, bytes]:
    """(H1's own parts, J1) of a share."""
    own = share.parts(params, context)
    return own, _joint_x(own[:PART_BYTES], share.helper_part)


def _helper_joint(share: HelperShare, context: bytes) -> tuple[bytes, bytes]:
    """(H2's own part, J1) of a share."""
    if len(share.leader_parts) != 2 * PART_BYTES:
        raise ValueError(f"H1's joint randomness parts must be {2 * PART_BYTES} bytes")
    own = share.part(context)
    return own, _joint_x(share.leader_parts[:PART_BYTES], own)


def share_dots(
    params: NormProofParams, share: LeaderShare | HelperShare, context: bytes
) -> tuple[bytes, np.ndarray]:
    """(J1, the wraparound dots of this server's share): the part of a verifier message that
    no coin changes, computed as the share arrives. J1 binds the x share (through H1's x-part
    and H2's seed), so dots looked up by it are never another share's."""
    if isinstance(share, LeaderShare):
        _, joint_x = _leader_joint(params, share, context)
        return joint_x, _share_dots(params, share.inputs, joint_x)
    _, joint_x = _helper_joint(share, context)
    return joint_x, _share_dots(params, share.expand(params)[0], joint_x)


def leader_query(
    params: NormProofParams,
    share: LeaderShare,
    context: bytes,
    verify_seed: bytes,
    dots: DotsLookup | None = None,
) -> VerifierMessage:
    """H1's verifier message for one provider's proof made for ``context``
    (:func:`proof_context`; ``verify_seed``: the servers' round coin); ``dots``: where the
    share's wraparound dots were computed before (:func:`share_dots`)."""
    own, joint_x = _leader_joint(params, share, context)
    joint_w = _joint_w(joint_x, own[PART_BYTES:])
    ready = None if dots is None else dots(joint_x)
    values = _query(
        params, True, share.inputs, share.proof, joint_x, joint_w, verify_seed, ready
    )
    return VerifierMessage(values, joint_w, True, own + share.helper_part)


def helper_query(
    params: NormProofParams,
    share: HelperShare,
    context: bytes,
    verify_seed: bytes,
    dots: DotsLookup | None = None,
) -> VerifierMessage:
    """H2's verifier message for one provider's proof made for ``context``."""
    own, joint_x = _helper_joint(share, context)
    inputs, proof = share.expand(params)
    joint_w = _joint_w(joint_x, share.leader_parts[PART_BYTES:])
    ready = None if dots is None else dots(joint_x)
    values = _query(params, False, inputs, proof, joint_x, joint_w, verify_seed, ready)
    return VerifierMessage(values, joint_w, False, share.leader_parts + own)


#: decide's reasons for proofs whose joint randomness the two servers do not share.
ANOTHER_CONTEXT = (
    "the proof was made for another provider, round or run (replayed): none of its joint "
    "randomness parts is this one's"
)
PARTS_DISAGREE = (
    "its two servers' parts disagree: a joint randomness part the provider sent one server "
    "does not match the other server's share"
)


def _parts_verdict(a: VerifierMessage, b: VerifierMessage) -> str | None:
    """Each server's own parts against what the provider sent the other (None: they match)."""
    if {a.leader, b.leader} != {True, False}:
        return "the two verifier messages are not one from each server"
    h1, h2 = (a, b) if a.leader else (b, a)
    if len(h1.parts) != 3 * PART_BYTES or len(h2.parts) != 3 * PART_BYTES:
        return "verifier message without its joint randomness parts"
    # Both list (H1's x-part, H1's bits-part, H2's part): each its own, the others as sent.
    same = [h1.parts[i : i + PART_BYTES] == h2.parts[i : i + PART_BYTES] for i in (0, 32, 64)]
    if all(same):
        return None
    return ANOTHER_CONTEXT if not any(same) else PARTS_DISAGREE


def decide(params: NormProofParams, a: VerifierMessage, b: VerifierMessage) -> str | None:
    """None if the two servers' messages accept the proof, else the reason it is refused
    (symmetric in a and b)."""
    p, m = params.p, params.chunk
    why = _parts_verdict(a, b)
    if why is not None:
        return why
    if a.joint_seed != b.joint_seed:
        return PARTS_DISAGREE
    if a.values.shape != (params.verifier_len,) or b.values.shape != a.values.shape:
        return "verifier message of the wrong length"
    v = _add(a.values, b.values, p)
    step = 2 * m + 2
    polynomial_ok, quadratic_ok = True, True
    for c in range(params.combinations):
        block = v[c * step : (c + 1) * step]
        gadget = _sum_rows(field_mul(block[:m], block[m : 2 * m], p)[:, None], p)[0]
        polynomial_ok &= int(gadget) == int(block[2 * m])
        quadratic_ok &= int(block[2 * m + 1]) == 0
    if not polynomial_ok:
        return "the proof polynomial does not match the wires"
    if not quadratic_ok:
        return "the squared norm or a bit check does not hold"
    if int(v[-1]) != 0:
        return "the norm bound or a wraparound check does not hold"
    return None
