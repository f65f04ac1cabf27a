"""A provider's proof that its vector is within the plan's L2 norm bound, checked by the two
servers jointly on secret shares (issue 35; PINE, Rothblum, Omri, Chen and Talwar 2023, on the
fully linear proofs of Boneh, Boyle, Corrigan-Gibbs, Gilboa and Ishai, CRYPTO 2019).

What is proved. The provider's integer vector ``x`` (d coordinates, in units) is shared
additively over a prime field F_p: the leader (H1) receives its share in full, the helper (H2) a
32-byte seed that expands to its share, so the upload is one field element per coordinate plus
O(sqrt d) for the proof. The servers accept only if ``||x||_2^2 <= B^2`` over the integers
(``B``: the plan's bound in units), up to the soundness error
:attr:`NormProofParams.soundness_error`.

How. The provider appends bits to ``x`` (the "encoded input" w, all of it shared):

- ``V0 = ||x||^2`` and ``U0 = B^2 - V0``, b0 bits each (b0 = bit length of B^2). The servers
  check ``sum x_i^2 = V0`` (quadratic: the proof) and ``V0 + U0 = B^2`` (linear). In the field
  that bounds the norm only if ``sum x_i^2`` does not wrap around p;
- the wraparound checks, r repetitions: ``z_k in {-1, 0, 1}^d`` (probabilities 1/4, 1/2, 1/4)
  drawn from a joint seed J that hashes both shares (Fiat-Shamir: chosen after the shares are
  fixed); the provider sends the b1 bits of ``V_k = <z_k, x> + lw`` and the servers check
  ``<z_k, x> + lw - V_k = 0`` (linear, on their shares). An honest vector has
  ``|<z_k, x>| <= alpha B`` except with probability ``2 exp(-alpha^2 / 2)`` (Hoeffding); a vector
  whose squared norm wraps the field passes each repetition with probability at most 1/2 when
  ``p >= 81 H^2`` (H: the window's half-width; PINE, Lemma 4.3 and Claim 4.9);
- every appended entry is a bit: ``beta^2 - beta = 0`` (quadratic: the proof).

The quadratic checks are one random combination ``rho_0 (sum x_i^2 - V0) + sum_j rho_j
(beta_j^2 - beta_j)`` (rho from J), proved with one fully linear proof: a ParallelSum of m
multiplication gadgets ``sum_l u_l a_l`` (u = rho * a) over M = N' - 1 calls, wire polynomials
through the N'-th roots of unity (N' a power of two; the 0th point holds a random seed per wire,
which makes the opened wire values uniform), and the proof polynomial P = sum_l U_l A_l of degree
<= 2(N' - 1). The servers query at a point t they choose jointly after the shares are in (never
a root of unity), open ``U_l(t), A_l(t), P(t)``, the combination's value and a random combination
of the linear checks, and accept if ``sum_l U_l(t) A_l(t) = P(t)`` and both combinations are 0.

Soundness error per proof (:attr:`NormProofParams.soundness_error`), for a vector over the
bound: ``2^-r`` (wraparound) + ``(2N' - 2) / (p - N')`` (the polynomial identity at t) + ``2/p``
(the two random combinations). J and rho come from a hash of the provider's shares, so a
provider may re-share and retry: each try costs a full sharing, hashing and proof of its vector,
and succeeds with probability at most ``2^-r + 1/p``; t is the servers' and cannot be ground.

The field: the smallest prime ``p = c 2^K + 1`` (K >= the ring's L, and >= log2(2N') for the
transforms) with ``p >= max(81 H^2, 2^(b0 + 1), 2^L + 1, 2^41 (2N' + 2))``, below 2^62.
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
    "HelperShare",
    "LeaderShare",
    "NormField",
    "NormProofParams",
    "VerifierMessage",
    "choose_field",
    "decide",
    "encoded_input",
    "helper_query",
    "leader_query",
    "prove",
    "prove_unchecked",
    "wrapping_vector",
]

#: Wraparound repetitions: each one a vector over the bound passes with probability <= 1/2.
DEFAULT_REPETITIONS = 64
#: Honest vectors fail a repetition with probability <= 2 exp(-alpha^2/2); alpha is set so that
#: all r repetitions pass but with probability 2^-COMPLETENESS_BITS.
COMPLETENESS_BITS = 50
MAX_FIELD_BITS = 62
_TAG = b"spgc-norm-proof/v1/"


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
            (1 << ring_bits) + 1,  # the sum's reconstruction (spgc.norm_proof docs)
            (1 << 41) * (2 * points + 2),  # the polynomial identity's error <= 2^-41
        )
        two_adicity = max(ring_bits, (2 * points).bit_length() - 1)
        field = choose_field(min_p, two_adicity)
        return cls(dim, bound, ring_bits, repetitions, norm_bits, window_bits, points, chunk, field)

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
    def proof_len(self) -> int:
        """2m wire seeds, then P's 2N' - 1 coefficients."""
        return 2 * self.chunk + 2 * self.points - 1

    @property
    def verifier_len(self) -> int:
        """U_l(t), A_l(t) (2m), P(t), the quadratic combination, the linear combination."""
        return 2 * self.chunk + 3

    @property
    def element_bytes(self) -> int:
        return (self.p.bit_length() + 7) // 8

    @property
    def soundness_error(self) -> float:
        """Probability that a vector over the bound is accepted (per proof; see the module)."""
        flp = (2 * self.points - 2) / (self.p - self.points)
        return 2.0**-self.repetitions + flp + 2.0 / self.p

    @cached_property
    def _omega(self) -> int:
        return self.field.root_of_unity(self.points)


def _chunking(n_inputs: int) -> tuple[int, int]:
    """(N', m) with (N' - 1) m >= n_inputs, minimising the proof and the verifier message."""
    best: tuple[int, int, int] | None = None
    points = 2
    while points <= 1 << 22:
        chunk = -(-n_inputs // (points - 1))
        cost = (2 * chunk + 2 * points) + (2 * chunk + 3)
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


# ---- the messages


@dataclass(frozen=True)
class LeaderShare:
    """What H1 receives: its share of the encoded input and of the proof, in full."""

    inputs: np.ndarray  # uint64[n_inputs]
    proof: np.ndarray  # uint64[proof_len]
    blind: bytes  # 32 bytes: hides the input share inside the joint randomness part
    helper_part: bytes  # 32 bytes: the helper's joint randomness part, as the provider computed it

    def joint_part(self, params: NormProofParams) -> bytes:
        return _leader_part(self.blind, self.inputs[: params.dim])


@dataclass(frozen=True)
class HelperShare:
    """What H2 receives: a seed its shares expand from, and the leader's joint randomness part."""

    seed: bytes  # 32 bytes from the OS CSPRNG
    leader_part: bytes  # 32 bytes

    def expand(self, params: NormProofParams) -> tuple[np.ndarray, np.ndarray]:
        inputs = field_expand(_seed16("helper-inputs", self.seed), params.n_inputs, params.p)
        proof = field_expand(_seed16("helper-proof", self.seed), params.proof_len, params.p)
        return inputs, proof

    def joint_part(self) -> bytes:
        return _h("helper-part", self.seed)


def _leader_part(blind: bytes, inputs: np.ndarray) -> bytes:
    # Only x's share enters the joint randomness: the bits are chosen after it.
    return _h("leader-part", blind, np.ascontiguousarray(inputs).astype("<u8").tobytes())


def _joint(leader_part: bytes, helper_part: bytes) -> bytes:
    return _h("joint", leader_part, helper_part)


@dataclass(frozen=True)
class VerifierMessage:
    """One server's share of the verification for one provider; the two are summed."""

    values: np.ndarray  # uint64[verifier_len]
    joint_seed: bytes  # the J this server derived: both must be equal


# ---- the provider's side


def _rhos(params: NormProofParams, joint: bytes) -> np.ndarray:
    """rho_0 (for sum x^2 - V0), then one rho per appended bit."""
    return field_expand(_seed16("rho", joint), 1 + params.n_bits, params.p)


def _weights(params: NormProofParams, rhos: np.ndarray) -> np.ndarray:
    """The multiplier c_i of each input in u = c * a."""
    w = np.empty(params.n_inputs, dtype=np.uint64)
    w[: params.dim] = rhos[0]
    w[params.dim :] = rhos[1:]
    return w


def _wire_values(
    params: NormProofParams, a: np.ndarray, rhos: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    """(2m, N') values of the wire polynomials at the roots of unity: column 0 the seeds,
    column k the k-th gadget call's inputs (u rows first, then a rows), zero past the input."""
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
    params: NormProofParams, x: np.ndarray, joint: bytes, strict: bool = True
) -> np.ndarray | None:
    """The encoded input w (field elements). strict: None if a wraparound check fails (an
    honest vector: probability <= 2^-50; the caller re-shares and tries again). Not strict
    (a dishonest provider's best try): every value is cut to its bits, so what does not fit
    is misrepresented and the servers' checks catch it."""
    p = params.p
    xf = _to_field(x, p)
    norm2 = int(field_matvec(xf[None, :], xf, p)[0])
    dots = wraparound_dots(xf, _seed16("wraparound", joint), params.repetitions, p)
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
    """P's 2N' - 1 coefficients from the wire values w (2m, N')."""
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


def prove(
    x: np.ndarray, params: NormProofParams, max_tries: int = 4
) -> tuple[LeaderShare, HelperShare]:
    """Share the integer vector ``x`` (int64, ``||x||_2 <= B``) with its norm proof.

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
        shares = _share_and_prove(x, params, strict=True, edit=None)
        if shares is not None:
            return shares
    raise ValueError(f"the wraparound checks failed {max_tries} times: x is not within the bound")


EncodedEdit = Callable[[np.ndarray, bytes], np.ndarray]


def prove_unchecked(
    x: np.ndarray, params: NormProofParams, edit: EncodedEdit | None = None
) -> tuple[LeaderShare, HelperShare]:
    """What a dishonest provider running this code can send for any integer vector: the bits
    it cannot represent are cut, and ``edit(w, joint_seed)`` may rewrite the encoded input
    before the proof is made. For tests and ``spgc bench load --poison``; the servers must
    refuse every such share whose vector is over the bound."""
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.shape != (params.dim,):
        raise ValueError(f"expected an integer vector of length {params.dim}, got {x.shape}")
    shares = _share_and_prove(x.astype(np.int64), params, strict=False, edit=edit)
    assert shares is not None
    return shares


def encoded_input(params: NormProofParams, x: np.ndarray, joint_seed: bytes) -> np.ndarray:
    """The encoded input (x, then the appended bits) a prover makes of ``x`` under the joint
    randomness ``joint_seed``, bits that do not fit cut: with :func:`prove_unchecked`'s
    ``edit``, a proof made for another vector than the one shared (tests, bench load)."""
    w = _encode(params, np.asarray(x, dtype=np.int64), joint_seed, strict=False)
    assert w is not None
    return w


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


def _share_and_prove(
    x: np.ndarray, params: NormProofParams, strict: bool, edit: EncodedEdit | None
) -> tuple[LeaderShare, HelperShare] | None:
    p = params.p
    helper = os.urandom(32)
    h_inputs, h_proof = HelperShare(helper, b"").expand(params)
    l_x = _sub(_to_field(x, p), h_inputs[: params.dim], p)
    blind = os.urandom(32)
    leader_part = _leader_part(blind, l_x)
    helper_part = _h("helper-part", helper)
    joint = _joint(leader_part, helper_part)
    w = _encode(params, x, joint, strict)
    if w is None:
        return None
    if edit is not None:
        w = np.asarray(edit(w.copy(), joint), dtype=np.uint64)
        if w.shape != (params.n_inputs,) or (w.size and int(w.max()) >= p):
            raise ValueError("edit must return n_inputs field elements")
    seeds = _random_elements(2 * params.chunk, p)
    wires = _wire_values(params, w, _rhos(params, joint), seeds)
    proof = np.concatenate([seeds, _prove_polynomial(params, wires)])
    # The leader's x share is the one the joint randomness hashed, whatever edit did to w.
    l_inputs = _sub(w, h_inputs, p)
    l_inputs[: params.dim] = l_x
    leader = LeaderShare(l_inputs, _sub(proof, h_proof, p), blind, helper_part)
    return leader, HelperShare(helper, leader_part)


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
    joint: bytes,
    verify_seed: bytes,
) -> VerifierMessage:
    p, m, n, d = params.p, params.chunk, params.points, params.dim
    if inputs.shape != (params.n_inputs,) or proof.shape != (params.proof_len,):
        raise ValueError("share of the wrong length")
    if (inputs.size and int(inputs.max()) >= p) or (proof.size and int(proof.max()) >= p):
        raise ValueError("share holds a value outside the field")
    rhos = _rhos(params, joint)
    t = _query_point(params, verify_seed, joint)
    wires = _wire_values(params, inputs, rhos, proof[: 2 * m])
    f_t = field_matvec(wires, _lagrange_at(params, t), p)
    coeffs = np.ascontiguousarray(proof[2 * m :])
    p_t = _dot(coeffs, _powers(t, coeffs.size, p), p)
    # The gadget calls' sum: sum_{k=1..M} P(w^k) = N' (c_0 + c_N') - P(1).
    c_n = int(coeffs[n]) if n < coeffs.size else 0
    gadgets = (n * (int(coeffs[0]) + c_n) - _dot(coeffs, np.ones_like(coeffs), p)) % p
    # The appended values from their bits: V0, U0, then V_k (k < r).
    b0, b1, r = params.norm_bits, params.window_bits, params.repetitions
    bits = inputs[d:]
    v0 = _dot(bits[:b0], _powers(2, b0, p), p)
    u0 = _dot(bits[b0 : 2 * b0], _powers(2, b0, p), p)
    vk = field_matvec(np.ascontiguousarray(bits[2 * b0 :].reshape(r, b1)), _powers(2, b1, p), p)
    quadratic = (gadgets - int(rhos[0]) * v0 - _dot(bits, rhos[1:], p)) % p
    # Linear checks, combined with weights of the servers' choosing.
    sigma = field_expand(_seed16("sigma", verify_seed, joint), 1 + r, p)
    dots = wraparound_dots(np.ascontiguousarray(inputs[:d]), _seed16("wraparound", joint), r, p)
    if leader:  # the constants enter one server's share only
        dots = _add(dots, np.full(r, params.window_offset, dtype=np.uint64), p)
        v0_check = (v0 + u0 - params.bound**2) % p
    else:
        v0_check = (v0 + u0) % p
    linear = (int(sigma[0]) * v0_check + _dot(_sub(dots, vk, p), sigma[1:], p)) % p
    values = np.concatenate([f_t, np.array([p_t, quadratic, linear], dtype=np.uint64)])
    return VerifierMessage(values, joint)


def leader_query(
    params: NormProofParams, share: LeaderShare, verify_seed: bytes
) -> VerifierMessage:
    """H1's verifier message for one provider (``verify_seed``: the servers' joint coin)."""
    joint = _joint(share.joint_part(params), share.helper_part)
    return _query(params, True, share.inputs, share.proof, joint, verify_seed)


def helper_query(
    params: NormProofParams, share: HelperShare, verify_seed: bytes
) -> VerifierMessage:
    """H2's verifier message for one provider."""
    inputs, proof = share.expand(params)
    joint = _joint(share.leader_part, share.joint_part())
    return _query(params, False, inputs, proof, joint, verify_seed)


def decide(params: NormProofParams, a: VerifierMessage, b: VerifierMessage) -> str | None:
    """None if the two servers' messages accept the proof, else the reason it is refused."""
    p, m = params.p, params.chunk
    if a.joint_seed != b.joint_seed:
        return "the joint randomness parts do not match the shares"
    if a.values.shape != (params.verifier_len,) or b.values.shape != a.values.shape:
        return "verifier message of the wrong length"
    v = _add(a.values, b.values, p)
    gadget = _sum_rows(field_mul(v[:m], v[m : 2 * m], p)[:, None], p)[0]
    if int(gadget) != int(v[2 * m]):
        return "the proof polynomial does not match the wires"
    if int(v[2 * m + 1]) != 0:
        return "the squared norm or a bit check does not hold"
    if int(v[2 * m + 2]) != 0:
        return "the norm bound or a wraparound check does not hold"
    return None
