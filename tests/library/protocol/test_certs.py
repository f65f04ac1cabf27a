"""Development PKI (`spgc.protocol.certs`) and the `spgc certs` command."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from spgc.app.cli import main
from spgc.privacy.ledger import Ledger
from spgc.privacy.ledger_format import load_signing_key, public_key_hex
from spgc.privacy.ledger_verify import verify_ledger
from spgc.protocol.certs import CertPaths, make_dev_pki, make_ledger_keys


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_files_and_key_permissions(tmp_path: Path) -> None:
    made = make_dev_pki(tmp_path / "pki", ["h1", "p1"])
    assert set(made) == {"h1", "p1"}
    ca = tmp_path / "pki" / "ca.pem"
    assert (tmp_path / "pki" / "ca.key").is_file()
    for name, paths in made.items():
        assert paths == CertPaths(
            cert=tmp_path / "pki" / f"{name}.pem", key=tmp_path / "pki" / f"{name}.key", ca=ca
        )
        assert paths.cert.is_file() and paths.key.is_file()
    for key in (tmp_path / "pki").glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_leaf_verifies_against_ca(tmp_path: Path) -> None:
    made = make_dev_pki(tmp_path, ["h2"])
    ca = _load(made["h2"].ca)
    leaf = _load(made["h2"].cert)
    leaf.verify_directly_issued_by(ca)  # raises on a bad signature or issuer

    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "h2"}
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    days = (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days
    assert 365 <= days <= 366

    # Full path validation as a TLS client would do it (server name and IP).
    from cryptography.x509.verification import PolicyBuilder, Store

    policy = PolicyBuilder().store(Store([ca]))
    for subject in (
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("h2"),
    ):
        chain = policy.build_server_verifier(subject).verify(leaf, [])
        assert chain[-1] == ca


def test_other_ca_does_not_verify(tmp_path: Path) -> None:
    a = make_dev_pki(tmp_path / "a", ["h1"])
    b = make_dev_pki(tmp_path / "b", ["h1"])
    with pytest.raises(InvalidSignature):
        _load(a["h1"].cert).verify_directly_issued_by(_load(b["h1"].ca))


def test_refuses_overwrite_unless_force(tmp_path: Path) -> None:
    make_dev_pki(tmp_path, ["h1"])
    before = (tmp_path / "h1.pem").read_bytes()
    with pytest.raises(FileExistsError):
        make_dev_pki(tmp_path, ["h1"])
    assert (tmp_path / "h1.pem").read_bytes() == before

    (tmp_path / "h1.key").chmod(0o644)
    make_dev_pki(tmp_path, ["h1"], force=True)
    assert (tmp_path / "h1.pem").read_bytes() != before
    assert stat.S_IMODE((tmp_path / "h1.key").stat().st_mode) == 0o600


@pytest.mark.parametrize("bad", [["../x"], ["ca"], ["h1", "h1"], [], ["a b"]])
def test_rejects_bad_names(tmp_path: Path, bad: list[str]) -> None:
    with pytest.raises(ValueError):
        make_dev_pki(tmp_path, bad)


def test_cli_certs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert main(["certs", str(out), "--names", "h1", "h2", "p1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "ca.key",
        "ca.pem",
        "h1.key",
        "h1.pem",
        "h2.key",
        "h2.pem",
        "p1.key",
        "p1.pem",
    ]
    capsys.readouterr()

    # A second run refuses, with a one-line error and exit code 2, not a traceback.
    assert main(["certs", str(out), "--names", "h1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spgc: error: refusing to overwrite")
    assert "Traceback" not in err

    assert main(["certs", str(out), "--names", "h1", "--force"]) == 0


def test_cli_default_names(tmp_path: Path) -> None:
    """Servers h1 h2 serve TLS and authenticate as clients; providers p1..p3 only the latter."""
    assert main(["certs", str(tmp_path)]) == 0
    for name in ("h1", "h2", "p1", "p2", "p3"):
        eku = _load(tmp_path / f"{name}.pem").extensions.get_extension_for_class(
            x509.ExtendedKeyUsage
        )
        client = {ExtendedKeyUsageOID.CLIENT_AUTH}
        assert set(eku.value) == (client if name.startswith("p") else
                                  client | {ExtendedKeyUsageOID.SERVER_AUTH})  # fmt: skip


def test_cli_names_and_providers(tmp_path: Path) -> None:
    assert main(["certs", str(tmp_path), "--names", "agg-a", "--providers", "lab1"]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.pem")) == ["agg-a.pem", "ca.pem", "lab1.pem"]
    eku = _load(tmp_path / "lab1.pem").extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert list(eku.value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # A name cannot be both a server and a provider.
    assert main(["certs", str(tmp_path / "x"), "--names", "a1", "--providers", "a1"]) == 2


def test_ledger_signing_keys(tmp_path):
    """`spgc certs DIR --ledger-keys h1 h2`: Ed25519 pairs that sign a ledger and pin it."""
    made = make_ledger_keys(tmp_path, ["h1", "h2"])
    key_path, pub_path = made["h1"]
    assert (key_path.stat().st_mode & 0o777) == 0o600
    key = load_signing_key(key_path)
    public = serialization.load_pem_public_key(pub_path.read_bytes())
    assert public_key_hex(public) == public_key_hex(key)
    other = load_signing_key(made["h2"][0])  # h2's key co-signs h1's release entries
    header = {"run_id": "r", "server": "h1", "mode": "only-mpc", "plan_sha256": "00",
              "noise_multiplier": 0.0, "sampling": {}, "accountant": "rdp", "delta": 1e-5,
              "sensitivity_units": 1.0, "max_batch_size": 0, "peer": "h2",
              "clip": {"rule": "fixed", "clip_norm": 1.0}, "backend": "gc",
              "verify_inputs": "none", "peer_public_key": public_key_hex(other)}  # fmt: skip
    ledger = Ledger.open(tmp_path / "ledger.jsonl", key, header)
    statement, _ = ledger.statement(0, 0, 1.0, float("inf"))
    ledger.record_release(0, 0, float("inf"), other.sign(statement), clip_norm=1.0)
    h2_pub = serialization.load_pem_public_key(made["h2"][1].read_bytes())
    both = {"h1": public_key_hex(public), "h2": public_key_hex(h2_pub)}
    assert verify_ledger(tmp_path / "ledger.jsonl", both).steps == 1
    swapped = {"h1": public_key_hex(h2_pub), "h2": public_key_hex(public)}
    with pytest.raises(ValueError, match="public_key is not the key pinned for h1"):
        verify_ledger(tmp_path / "ledger.jsonl", swapped)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        make_ledger_keys(tmp_path, ["h1"])


def test_tls_files_check_names_what_is_wrong(tmp_path: Path) -> None:
    """TlsFiles.check: what gRPC would only report as "cannot bind" or as failed handshakes."""
    from spgc.wire.tls import TlsFiles

    make_dev_pki(tmp_path / "a", ["h1", "h2"])
    make_dev_pki(tmp_path / "b", ["h1"])
    good = TlsFiles.from_dir(tmp_path / "a", "h1")
    good.check()
    other_key = TlsFiles(good.cert, tmp_path / "a" / "h2.key", good.ca)
    with pytest.raises(ValueError, match=r"h2\.key is not the key of certificate"):
        other_key.check()
    # A CA file of other organisations (it verifies the peers, not this party) is fine.
    TlsFiles(good.cert, good.key, tmp_path / "b" / "ca.pem").check()
    (tmp_path / "junk.key").write_text("not a key\n")
    with pytest.raises(ValueError, match=r"junk\.key cannot be used: not a PEM private key"):
        TlsFiles(good.cert, tmp_path / "junk.key", good.ca).check()
    with pytest.raises(ValueError, match="is not a PEM certificate"):
        TlsFiles(tmp_path / "junk.key", good.key, good.ca).check()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TlsFiles(tmp_path / "none.pem", good.key, good.ca).check()


def test_a_party_is_added_with_the_ca_already_there(tmp_path: Path) -> None:
    """`spgc certs DIR --providers p4` next to an existing CA: p4 is signed by that CA, which
    stays as it was (the deployment's other certificates still verify against it)."""
    first = make_dev_pki(tmp_path, ["h1"], providers=["p1"])
    ca_before = (tmp_path / "ca.pem").read_bytes()
    assert main(["certs", str(tmp_path), "--providers", "p4"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() == ca_before
    ca = _load(first["h1"].ca)
    _load(tmp_path / "p4.pem").verify_directly_issued_by(ca)
    _load(tmp_path / "h1.pem").verify_directly_issued_by(ca)
