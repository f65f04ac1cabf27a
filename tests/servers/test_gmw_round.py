"""A round's circuits on the GMW backend (PartyLink.open(..., backend="gmw"): Beaver triples
from silent OT): the same outputs as the plaintext reference and the garbled-circuit backend
for the same seeds, and its bytes and round trips."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from helpers import Background, loopback_server_config
from test_spgc_circuit import shares_of, sums_for

from garbled_core.discrete_gaussian import build_trial_circuit, derive_params
from garbled_core.sampler_circuit import build_trial_description
from spgc.privacy.noise import SPARES_EVERY, sample_noise_plain
from spgc.servers.gc_party import PartyLink, aggregate_plain, run_aggregate
from spgc.servers.peer import config_differences
from spgc.servers.spgc_circuit import fused_trial_description, noisy_sum_circuit
from spgc.settings.config import ConfigError
from spgc.settings.plan import make_plan


def gmw_links(two_party):
    tp = two_party()
    return (
        PartyLink.open("garbler", tp.garbler_channel, backend="gmw"),
        PartyLink.open("evaluator", tp.evaluator_channel, backend="gmw"),
    )


def run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, mode):
    side = Background(lambda: run_aggregate("garbler", lg, a1, s1, sigma, ring_bits, mode))
    ye, ce = run_aggregate("evaluator", le, a2, s2, sigma, ring_bits, mode)
    yg, cg = side.result(timeout=300)
    return yg, ye, cg, ce


def test_gmw_round_equals_the_plaintext_reference(two_party):
    ring_bits, sigma = 16, 1000.0
    sums = sums_for(ring_bits, 400, 7)
    a1, a2 = shares_of(sums, ring_bits, 8)
    lg, le = gmw_links(two_party)
    assert type(lg.session).__name__ == "GmwParty"
    # only-mpc: exactly S
    yg, ye, _, _ = run_both(lg, le, a1, a2, None, None, None, ring_bits, "only-mpc")
    assert ye.tolist() == yg.tolist() == sums
    # spgc: S plus the noise both seeds determine, bit for bit the plaintext sampler's
    s1, s2 = os.urandom(32), os.urandom(32)
    yg, ye, cg, ce = run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, "spgc")
    assert yg.tolist() == ye.tolist()
    # (gmw runs the sampler with spare trials: the reference is told so)
    z = sample_noise_plain(s1, s2, len(sums), sigma, spares_every=SPARES_EVERY["gmw"])
    assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
    ref = aggregate_plain(
        a1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma, backend="gmw"
    )
    assert [int(v) for v in ref] == [int(v) for v in ye]
    # Without the spares it would have been other noise: the reference is not vacuous.
    assert sample_noise_plain(s1, s2, len(sums), sigma).tolist() != z.tolist()
    # Online, each party opens 1 bit per AND gate (e) and 1 per group of gates of a layer
    # sharing an input (d), so between 1 and 2 bits per AND gate, and the triples' silent OTs
    # come a whole LPN iteration at a time: far below garbling's 24.6 bytes per AND gate.
    and_instances = cg["and_gates"]
    online = cg["phases"]["tables"]["sent"]
    # (each AND gate's openings of a run are packed per gate: at most a byte of padding for d
    # and one for e per gate and run; a round runs the trial circuit and the addition)
    params = derive_params(sigma)
    width = max(ring_bits, params.noise_bits) + 1
    gates = (
        build_trial_circuit(params, arithmetic="depth").and_count
        + noisy_sum_circuit(ring_bits, params.noise_bits, width, arithmetic="depth").and_count
    )
    assert and_instances / 8 <= online < 0.95 * and_instances / 4 + 2 * gates * cg["rounds"]
    assert online == ce["phases"]["tables"]["received"]
    # Fresh triples every run: the session used one per AND gate and instance of each run,
    # from one random OT each way per AND group and instance (a group shares its a).
    assert lg.session.triples_used == le.session.triples_used >= and_instances
    assert lg.session.ots_used == le.session.ots_used < 0.9 * lg.session.triples_used


def test_gmw_and_gc_backends_refuse_each_other(two_party):
    tp = two_party()
    lg = PartyLink.open("garbler", tp.garbler_channel, backend="gmw")
    le = PartyLink.open("evaluator", tp.evaluator_channel)  # gc
    a = np.zeros(4, dtype=np.uint64)
    side = Background(lambda: run_aggregate("garbler", lg, a, None, None, 16, "only-mpc"))
    with pytest.raises(Exception) as info:
        run_aggregate("evaluator", le, a, None, None, 16, "only-mpc")
    assert "Traceback" not in str(info.value)
    with pytest.raises(Exception):  # noqa: B017 - either engine error type, both sides fail
        side.result(timeout=120)


def test_an_unknown_backend_is_refused_in_one_line(two_party):
    tp = two_party()
    with pytest.raises(ValueError, match="backend must be one of"):
        PartyLink.open("garbler", tp.garbler_channel, backend="ckks")


def test_the_backend_is_part_of_the_plan_and_refused_where_it_cannot_run() -> None:
    gmw = loopback_server_config(backend="gmw")
    assert make_plan(gmw).training_config("r").backend == "gmw"
    gc = make_plan(loopback_server_config()).training_config("r")
    assert gc.backend == "gc"
    # The peer's handshake compares the plans field by field: a backend mismatch is named.
    diffs = config_differences(make_plan(gmw).training_config("r"), gc)
    assert diffs == ["backend (h1 'gmw', h2 'gc')"]
    with pytest.raises(ConfigError, match="mode dng runs none"):
        loopback_server_config(backend="gmw", mode="dng")
    # Ray worker pairs run either backend (test_ray_workers runs a gmw round on them)
    assert loopback_server_config(backend="gmw", workers=2).workers == 2
    with pytest.raises(ConfigError, match="backend"):
        loopback_server_config(backend="ckks")


def test_a_gmw_round_is_one_trial_run_and_one_exchange(two_party):
    """Mode spgc on gmw fuses the reconstruction and the noisy sum into the trial run
    (spgc_circuit.fused_trial_circuit): as deep as the trial alone, so a one-stage round is the
    trial's AND layers, its outputs and the opening exchange, counted by the channel (the run
    header travels with the first layer once the silent OT's iteration is buffered). A round
    whose leftover coordinates need stage 1 (these seeds) runs the fused trial again and
    still releases the plaintext reference, bit for bit."""
    ring_bits, sigma = 16, 1000.0
    params = derive_params(sigma)
    width = max(ring_bits, params.noise_bits) + 1
    depth = build_trial_description(params, arithmetic="depth").and_depth()
    fused = fused_trial_description(params, ring_bits, width)
    assert fused.and_depth() == depth
    assert fused.output_depths()["u_z"] < depth and fused.output_depths()["u_s"] < depth
    lg, le = gmw_links(two_party)
    sums = sums_for(ring_bits, 300, 5)
    a1, a2 = shares_of(sums, ring_bits, 6)
    for attempt in range(2):  # the first round starts the silent OT's first iteration
        s1 = hashlib.sha256(b"fused-round-g%d" % attempt).digest()
        s2 = hashlib.sha256(b"fused-round-e%d" % attempt).digest()
        yg, ye, cg, ce = run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, "spgc")
        ref = aggregate_plain(
            a1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma, backend="gmw"
        )
        assert [int(v) for v in ref] == yg.tolist() == ye.tolist()
    assert cg["rounds"] == 1  # (as almost always with the spare trials)
    assert cg["round_trips"] == ce["round_trips"] == depth + 2
    # Stage 1: six coordinates and these seeds leave one coordinate over after stage 0.
    sums = sums_for(ring_bits, 0, 9)[:6]  # edge values of the ring
    a1, a2 = shares_of(sums, ring_bits, 10)
    s1, s2 = hashlib.sha256(b"a8").digest(), hashlib.sha256(b"b8").digest()
    yg, ye, cg, ce = run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, "spgc")
    assert cg["rounds"] == 2 and cg["trials_per_round"] == [8, 1]
    ref = aggregate_plain(
        a1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma, backend="gmw"
    )
    assert [int(v) for v in ref] == yg.tolist() == ye.tolist()
    z = sample_noise_plain(s1, s2, 6, sigma, spares_every=SPARES_EVERY["gmw"])
    assert [y - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
