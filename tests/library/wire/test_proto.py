"""The wire protocol (proto/spgc/v1): committed generated code in sync, documented, stable."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from helpers import REPO_ROOT, proto_descriptors_with_comments

import spgc.wire
from spgc.wire import (
    aggregation_pb2,
    aggregation_pb2_grpc,
    codegen,
    peer_pb2,
    peer_pb2_grpc,
    provider_set_digest,
    seed_commitment,
)

REPO = REPO_ROOT
PROTO_ROOT = REPO / "proto"
COMMITTED = REPO / codegen.GENERATED_DIR


def _need_protoc() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test requirement) is missing")


def test_generated_code_is_in_sync() -> None:
    """Regenerating from proto/ with the pinned grpcio-tools gives the committed bytes."""
    _need_protoc()
    have = codegen.installed_generator_version()
    if have != codegen.GRPCIO_TOOLS_VERSION:
        pytest.skip(
            f"grpcio-tools {have} installed, committed code made with "
            f"{codegen.GRPCIO_TOOLS_VERSION} (test_descriptors_match_proto still runs)"
        )
    problems = codegen.compare(codegen.generate(PROTO_ROOT), COMMITTED)
    assert not problems, "run `python scripts/gen_proto.py`:\n" + "\n".join(problems)


def _strip_json_names(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    """protoc's descriptor sets carry json_name, the Python gencode drops it: ignore it."""

    def walk(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            walk(m.nested_type)

    walk(fdp.message_type)


def test_descriptors_match_proto() -> None:
    """Version-independent half: the descriptors compiled now equal the embedded ones."""
    _need_protoc()
    compiled = descriptor_pb2.FileDescriptorSet.FromString(codegen.descriptor_set(PROTO_ROOT))
    by_name = {f.name: f for f in compiled.file}
    for module in (aggregation_pb2, peer_pb2):
        embedded = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        fresh = by_name[embedded.name]
        _strip_json_names(fresh)
        _strip_json_names(embedded)
        assert fresh == embedded, f"{embedded.name} changed: run `python scripts/gen_proto.py`"


def test_installed_copy_matches_checkout() -> None:
    """The package under test holds the checkout's generated modules (no stale install)."""
    installed = Path(spgc.wire.__file__).resolve().parent / "_generated"
    for path in sorted(COMMITTED.glob("*.py*")):
        assert (installed / path.name).read_bytes() == path.read_bytes(), path.name


def test_gen_proto_check_script() -> None:
    _need_protoc()
    if codegen.installed_generator_version() != codegen.GRPCIO_TOOLS_VERSION:
        pytest.skip("grpcio-tools is not the pinned version")
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr


def test_generated_modules_pin_their_generator() -> None:
    text = (COMMITTED / "aggregation_pb2.py").read_text()
    assert f"grpcio-tools {codegen.GRPCIO_TOOLS_VERSION}" in text.splitlines()[0]
    assert "# ruff: noqa" in text.splitlines()[1]
    assert aggregation_pb2_grpc.GRPC_GENERATED_VERSION == codegen.GRPCIO_TOOLS_VERSION
    assert peer_pb2_grpc.GRPC_GENERATED_VERSION == codegen.GRPCIO_TOOLS_VERSION
    # package-relative imports, real module names (so messages pickle)
    assert "from spgc.v1" not in (COMMITTED / "peer_pb2.py").read_text()
    assert aggregation_pb2.ShareHeader.__module__ == "spgc.wire._generated.aggregation_pb2"


def test_every_declaration_is_commented(tmp_path: Path) -> None:
    """Every message, field, enum, enum value, service and rpc has a leading comment."""
    fds = proto_descriptors_with_comments(tmp_path)
    missing: list[str] = []
    for f in fds.file:
        commented = {
            tuple(loc.path)
            for loc in f.source_code_info.location
            if loc.leading_comments.strip() or loc.trailing_comments.strip()
        }

        def need(
            path: tuple[int, ...], label: str, file: str = f.name, commented: set = commented
        ) -> None:
            if path not in commented:
                missing.append(f"{file}: {label}")

        def walk(msgs: list, prefix: tuple[int, ...], scope: str) -> None:
            for i, m in enumerate(msgs):
                mp = (*prefix, i)
                need(mp, f"message {scope}{m.name}")
                for j, fld in enumerate(m.field):
                    need((*mp, 2, j), f"field {scope}{m.name}.{fld.name}")
                walk(list(m.nested_type), (*mp, 3), f"{scope}{m.name}.")

        walk(list(f.message_type), (4,), "")
        for i, e in enumerate(f.enum_type):
            need((5, i), f"enum {e.name}")
            for j, v in enumerate(e.value):
                if v.number != 0:  # the UNSPECIFIED zero value is self-explanatory
                    need((5, i, 2, j), f"enum value {v.name}")
        for i, s in enumerate(f.service):
            need((6, i), f"service {s.name}")
            for j, m in enumerate(s.method):
                need((6, i, 2, j), f"rpc {s.name}.{m.name}")
    assert not missing, "uncommented: " + ", ".join(missing)


def test_wire_field_numbers_are_stable() -> None:
    """Renumbering a field breaks deployed peers silently; the streaming messages are pinned."""

    def numbers(cls: type) -> dict[str, int]:
        return {f.name: f.number for f in cls.DESCRIPTOR.fields}

    assert numbers(aggregation_pb2.VectorChunk) == {"index": 1, "data": 2}
    assert numbers(aggregation_pb2.ShareChunk) == {"header": 1, "chunk": 2}
    assert numbers(aggregation_pb2.ModelChunk) == {"header": 1, "chunk": 2}
    assert numbers(aggregation_pb2.ShareHeader) == {
        "run_id": 1,
        "round": 2,
        "server_role": 3,
        "num_elements": 4,
        "ring_bits": 5,
        "chunk_bytes": 6,
        "chunk_count": 7,
        "submission_id": 8,
        "sha256": 9,
        "provider_id": 10,
        "compute_seconds": 11,
        "vector_id": 12,
        "model_version": 13,
        "encoding": 14,
        "norm_blind": 15,
        "norm_joint_part": 16,
        "norm_seed": 17,
    }
    assert numbers(aggregation_pb2.ModelHeader) == {
        "run_id": 1,
        "version": 2,
        "num_parameters": 3,
        "sha256": 4,
        "chunk_bytes": 5,
        "chunk_count": 6,
        "model": 7,
        "published_at": 8,
        "part": 9,
    }


def test_services_and_package() -> None:
    assert spgc.wire.AGGREGATOR_SERVICE == "spgc.v1.Aggregator"
    assert spgc.wire.PEER_SERVICE == "spgc.v1.Peer"
    agg = aggregation_pb2.DESCRIPTOR.services_by_name["Aggregator"]
    assert {m.name: (m.client_streaming, m.server_streaming) for m in agg.methods} == {
        "Hello": (False, False),
        "FetchModel": (False, True),
        "SubmitShare": (True, False),
        "RoundStatus": (False, False),
        "DeclinePlan": (False, False),
        "FetchLedger": (False, False),
    }
    peer = peer_pb2.DESCRIPTOR.services_by_name["Peer"]
    assert {m.name for m in peer.methods} == {
        "Handshake",
        "RoundBarrier",
        "AgreeProviders",
        "CheckModel",
        "CosignRelease",
        "CloseLedger",
        "SyncPool",
        "ProduceNoise",
        "PairWorkers",
    }


def test_server_info_round_trip() -> None:
    cfg = aggregation_pb2.TrainingConfig(
        run_id="r1",
        mode=aggregation_pb2.MODE_SPGC,
        num_parameters=10_000_000,
        ring_bits=48,
        scale=2.0**16,
        clip_norm=1.0,
        l2_bound_units=2.0**16,
        sampling_rate=0.01,
        noise_multiplier=1.1,
        step_epsilon=0.5,
        step_delta=1e-6,
    )
    info = aggregation_pb2.ServerInfo(
        protocol_version=spgc.wire.PROTOCOL_VERSION,
        role=aggregation_pb2.SERVER_ROLE_H1,
        provider_id="p1",
        config=cfg,
        round=aggregation_pb2.RoundInfo(round=3, model_version=3),
    )
    again = aggregation_pb2.ServerInfo.FromString(info.SerializeToString())
    assert again == info
    assert again.config.WhichOneof("batch") == "sampling_rate"
    hello = peer_pb2.PeerHello(role=aggregation_pb2.SERVER_ROLE_H2, config=cfg)
    assert peer_pb2.PeerHello.FromString(hello.SerializeToString()).config == cfg
    req = aggregation_pb2.ModelRequest()
    assert not req.HasField("version")  # unset = current round's version


def test_provider_set_digest() -> None:
    a = provider_set_digest(["p2", "p1", "p1"])
    assert a == provider_set_digest(["p1", "p2"])
    assert a != provider_set_digest(["p1"])
    assert provider_set_digest([]) == provider_set_digest(())
    with pytest.raises(ValueError):
        provider_set_digest(["p\x00"])
    # "ab" + "c" must not collide with "a" + "bc": the 0x00 terminator separates names
    assert provider_set_digest(["ab", "c"]) != provider_set_digest(["a", "bc"])


def test_seed_commitment() -> None:
    seed = bytes(range(32))
    c = seed_commitment("run", 4, aggregation_pb2.SERVER_ROLE_H1, seed)
    assert len(c) == 32
    assert c == seed_commitment("run", 4, aggregation_pb2.SERVER_ROLE_H1, seed)
    assert c != seed_commitment("run", 5, aggregation_pb2.SERVER_ROLE_H1, seed)
    assert c != seed_commitment("run", 4, aggregation_pb2.SERVER_ROLE_H2, seed)
    assert c != seed_commitment("run2", 4, aggregation_pb2.SERVER_ROLE_H1, seed)
    with pytest.raises(ValueError, match="at least 32"):
        seed_commitment("run", 4, aggregation_pb2.SERVER_ROLE_H1, b"short")
