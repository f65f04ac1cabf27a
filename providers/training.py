"""Training and encoding: the round's model put into the local model, per-example gradients
(torch.func vmap) each clipped to C, fixed-point encoded with the announced rounding and summed
(G), ldp's local noise, and the vectors that leave: two additive shares of G (with verified
inputs: field shares and a norm proof), or G mod 2^L for one server (one of
:class:`~spgc.providers.client.ProviderClient`'s parts)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from spgc.common.logs import first_line, listed
from spgc.learning.gradients import bounded_chunk, clip_per_example, per_example_gradients
from spgc.learning.local_training import LocalTraining, model_delta
from spgc.learning.models import load_flat_params
from spgc.privacy.clipping import (
    AdaptiveClip,
    DecayClip,
    adaptive_clip_of,
    decay_clip_of,
    round_clip_norm,
)
from spgc.protocol.encoding import FixedPointConfig, encode_batch, stochastic_round
from spgc.protocol.norm_proof import NormProofParams, proof_context, prove
from spgc.protocol.sharing import check_fits, ring_mask, share
from spgc.providers.data_budget import ProviderBudget
from spgc.providers.errors import ModelFailed, RoundFailed
from spgc.providers.local_noise import local_noise
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2

__all__ = ["OutgoingShare", "Training"]

pb = aggregation_pb2


@dataclass(frozen=True)
class OutgoingShare:
    """What one server receives of a vector: its elements (uint64) and, with verified inputs
    (spgc.protocol.norm_proof), the field and the norm proof's header fields (ShareHeader)."""

    values: np.ndarray
    field_modulus: int | None = None
    norm_blind: bytes = b""
    norm_joint_part: bytes = b""
    norm_seed: bytes = b""


class Training:
    """Gradients, encoding and vectors (a part of ProviderClient: the attributes below are set
    by ``ProviderClient.__init__`` and ``connect``)."""

    cfg: ProviderConfig
    training: Any
    servers: list[Any]
    fixed_point: FixedPointConfig | None
    rounding_rng: np.random.Generator
    sampling_rng: Any
    noise_seed: bytes | None
    budget: ProviderBudget | None
    _model: Any
    _trained: Any
    _frozen: np.ndarray | None
    _x: np.ndarray | None
    _y: np.ndarray | None
    _round_infos: list[Any]
    last_round: int | None  # the round being shared (set by ``run_round`` first)
    # The plan's task and loss (spgc.learning.losses; set by ``connect``): what the gradients are
    # of.
    task_loss: tuple[str, str] = ("classification", "cross_entropy")
    # verify_inputs: l2: the norm proofs' parameters (set by ``connect``); None: no proofs.
    norm_proof: NormProofParams | None = None

    def encode(self, params: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, float, float]:
        """G (int64, d): the encoded clipped gradient sum; returns (G, compute s, encode s).
        With adaptive clipping G has d + 1 values: the last counts the unclipped examples
        (spgc.privacy.clipping)."""
        assert self.fixed_point is not None
        tc, fp = self.training, self.fixed_point
        adaptive = adaptive_clip_of(tc)  # checked when the plan was accepted
        decay = decay_clip_of(tc)
        clip_norm = self._round_clip_norm(adaptive, decay)
        self.load_params(params)
        provider_level = tc.adjacency == "provider"
        # The rows encoded: one per example, or one model delta per provider.
        rows = min(1, len(batch)) if provider_level else len(batch)
        if 0 < tc.max_batch_size < rows:
            raise RoundFailed(
                f"a batch of {len(batch)} examples is larger than the {tc.max_batch_size} the "
                "servers sized the ring for (their max_batch_size): this round is sat out, "
                "as the sum of all shares could wrap around"
            )
        limit = 2 ** (tc.ring_bits - 1) - 1
        if fp.max_abs_sum_units(rows) > limit:
            raise RoundFailed(
                f"a batch of {rows} rows with B={fp.l2_bound_units} units may reach "
                f"{fp.max_abs_sum_units(rows)} > 2^{tc.ring_bits - 1}-1, the signed limit "
                f"of Z_2^{tc.ring_bits}"
            )
        width = tc.num_parameters + (0 if adaptive is None else 1)
        total = np.zeros(width, dtype=np.int64)
        real_sum = np.zeros(width, dtype=np.float64)
        compute = encode = 0.0
        # gradient_chunk examples at a time, fewer for a big model (bounded memory).
        step = bounded_chunk(self.cfg.gradient_chunk, tc.num_parameters)
        # Left out by its coin, a provider shares zeros; with hide_participation it first does
        # a selected round's work on all its data and discards it, so the time its shares
        # leave does not tell the servers whether it took part.
        decoy = provider_level and not len(batch) and self.cfg.hide_participation
        work = np.arange(len(self._x), dtype=np.int64) if decoy else batch
        if provider_level:  # one row: the model delta of local training on the whole batch
            step = max(1, len(work))
        for start in range(0, len(work), step):
            t0 = time.perf_counter()
            idx = work[start : start + step]
            if adaptive is None and decay is None and not provider_level:
                clipped = self.clipped_gradients(idx)
            else:
                # One model delta (provider level) or the examples' gradients, clipped to the
                # round's C; with a moving clip rescaled to C0 (and adaptive's count).
                rows = self.local_delta(idx) if provider_level else self.example_gradients(idx)
                if adaptive is not None:
                    clipped = adaptive.rows(rows, clip_norm)
                elif decay is not None:
                    clipped = decay.rows(rows, clip_norm)
                else:
                    clipped = clip_per_example(rows, clip_norm)
            t1 = time.perf_counter()
            if tc.rounding == pb.ROUNDING_CONDITIONAL_STOCHASTIC:
                encoded = encode_batch(clipped, fp, self.rounding_rng, ring_bits=tc.ring_bits)
                if not decoy:
                    total += encoded
            elif not decoy:
                real_sum += clipped.sum(axis=0)
            t2 = time.perf_counter()
            compute += t1 - t0
            encode += t2 - t1
        t0 = time.perf_counter()
        if tc.rounding == pb.ROUNDING_STOCHASTIC:
            total = stochastic_round(real_sum * tc.scale, self.rounding_rng)
        elif tc.rounding == pb.ROUNDING_NEAREST:
            total = np.rint(real_sum * tc.scale).astype(np.int64)
        if tc.mode == pb.MODE_LDP:
            assert self.budget is not None  # connect() opened it
            self.budget.before_noise_draw(self._fixed_release())  # counted before it is drawn
            seed, self.noise_seed = self.noise_seed, None  # a seed is never used twice
            total = total + local_noise(tc.noise_std_units, width, seed)  # the count too
        check_fits(total, tc.ring_bits)
        encode += time.perf_counter() - t0
        return total, compute, encode

    def load_params(self, params: np.ndarray) -> None:
        """Put the round's model vector (its trained coordinates) into the local model; the
        frozen ones are those fetched once for the run."""
        if self._frozen is not None:
            params = self._trained.assemble(params, self._frozen)
        load_flat_params(self._model, params)

    def _round_clip_norm(self, adaptive: AdaptiveClip | None, decay: DecayClip | None) -> float:
        """The joined round's clip norm: the plan's, or with adaptive clipping the C_r both
        servers announce, or with a decaying clip the rule's C_r, which both servers must
        announce (RoundFailed otherwise: the round is sat out)."""
        if adaptive is None and decay is None:
            return float(self.training.clip_norm)
        announced = [i.clip_norm for i in self._round_infos]
        try:
            if adaptive is not None:
                return round_clip_norm(adaptive, announced)
            assert decay is not None
            for value in announced:
                decay.check_round(self._round_infos[0].round, value)
            return decay.norm_at(self._round_infos[0].round)
        except ValueError as exc:
            raise RoundFailed(f"{exc}: this round is sat out") from None

    def local_delta(self, idx: np.ndarray) -> np.ndarray:
        """adjacency provider: the model delta (1 x d, unclipped) of the plan's local training
        on local examples ``idx`` from the round's model (loaded by :meth:`encode`);
        ModelFailed when the model fails on them."""
        assert self._x is not None and self._y is not None
        task, loss = self.task_loss
        try:
            return model_delta(
                self._model, self._x[idx], self._y[idx], self._trained,
                LocalTraining.of_plan(self.training), self.sampling_rng, task=task, loss=loss,
            )  # fmt: skip
        except Exception as exc:  # whatever the user's model raises
            raise ModelFailed(
                f"the model failed in local training on {len(idx)} local examples: "
                f"{type(exc).__name__}: {first_line(exc)}"
            ) from None

    def clipped_gradients(self, idx: np.ndarray) -> np.ndarray:
        """The per-example gradients of local examples ``idx``, each clipped to C (float64,
        len(idx) x d): what :meth:`encode` encodes with a fixed clip norm."""
        return clip_per_example(self.example_gradients(idx), self.training.clip_norm)

    def example_gradients(self, idx: np.ndarray) -> np.ndarray:
        """The per-example gradients of local examples ``idx``, unclipped (float64, len(idx)
        x d); ModelFailed naming the examples when the model fails on them."""
        assert self._x is not None and self._y is not None
        try:
            task, loss = self.task_loss
            grads = per_example_gradients(
                self._model, self._x[idx], self._y[idx], chunk_size=len(idx), task=task, loss=loss
            )
        except Exception as exc:  # whatever the user's model raises
            raise ModelFailed(
                f"the model failed computing the gradients of local examples "
                f"{listed(idx.tolist(), 8)}: {type(exc).__name__}: {first_line(exc)}"
            ) from None
        return grads

    def make_vectors(self, total: np.ndarray) -> list[OutgoingShare]:
        """What each server receives: the two shares, or G mod 2^L for one server. With
        verified inputs H1's is its field share with its share of the norm proof, and H2's a
        seed it expands its own from (spgc.protocol.norm_proof.prove)."""
        bits = self.training.ring_bits
        params = self.norm_proof
        if len(self.servers) == 2 and params is not None:
            # The proof is for this run, this round and this provider only (a replay of it in
            # another is refused: spgc.protocol.norm_proof.proof_context).
            context = proof_context(self.training.run_id, int(self.last_round), self.cfg.name)
            try:
                leader, helper = prove(total, params, context)
            except ValueError as exc:  # the encoder bounds every example: a bug if it fires
                raise RoundFailed(f"this round's vector cannot be proved: {exc}") from None
            values = np.concatenate([leader.inputs, leader.proof])
            return [
                OutgoingShare(values, params.p, leader.blind, leader.helper_part),
                OutgoingShare(
                    np.zeros(0, dtype=np.uint64), params.p, b"", helper.leader_parts, helper.seed
                ),
            ]
        if len(self.servers) == 2:
            a1, a2 = share(total, bits)
            return [OutgoingShare(a1), OutgoingShare(a2)]
        check_fits(total, bits)
        clear = np.asarray(total, dtype=np.int64).view(np.uint64) & ring_mask(bits)
        return [OutgoingShare(clear)]
