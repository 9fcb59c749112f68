"""NodeIdentity: key file round trip, permissions, atomic save, libp2p peer id."""
from __future__ import annotations

import os
import stat

import pytest

from protocol.identity import IdentityError, NodeIdentity, base58btc, peer_id_from_public_key, verify_signature


def test_save_load_round_trip_with_mode_0600(tmp_path):
    identity = NodeIdentity.generate()
    path = tmp_path / "keys" / "node.key"
    identity.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = NodeIdentity.load(path)
    assert loaded.public_key_bytes == identity.public_key_bytes
    assert loaded.private_seed() == identity.private_seed()
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert [p.name for p in path.parent.iterdir()] == ["node.key"]  # no temp file left behind


def test_save_refuses_to_replace_an_identity_unless_asked(tmp_path):
    path = tmp_path / "node.key"
    first = NodeIdentity.generate()
    first.save(path)
    with pytest.raises(FileExistsError):
        NodeIdentity.generate().save(path)
    assert NodeIdentity.load(path).public_key_bytes == first.public_key_bytes
    second = NodeIdentity.generate()
    second.save(path, overwrite=True)
    assert NodeIdentity.load(path).public_key_bytes == second.public_key_bytes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_load_refuses_group_or_world_readable_key(tmp_path):
    path = tmp_path / "node.key"
    NodeIdentity.generate().save(path)
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        NodeIdentity.load(path)


@pytest.mark.parametrize(
    "content, match",
    [(b"", "not an unencrypted PEM"), (b"garbage\n", "not an unencrypted PEM"), (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "not an unencrypted PEM")],
)
def test_load_reports_corrupt_files_clearly(tmp_path, content, match):
    path = tmp_path / "node.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError, match=match):
        NodeIdentity.load(path)


def test_load_refuses_other_key_types(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "node.key"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        NodeIdentity.load(path)


def test_missing_file_error_says_how_to_create_one(tmp_path):
    with pytest.raises(IdentityError, match="does not exist"):
        NodeIdentity.load(tmp_path / "absent.key")


def test_load_or_generate_creates_once(tmp_path):
    path = tmp_path / "node.key"
    first = NodeIdentity.load_or_generate(path)
    assert NodeIdentity.load_or_generate(path).public_key_bytes == first.public_key_bytes


def test_seed_round_trip_and_signatures():
    identity = NodeIdentity.generate()
    again = NodeIdentity.from_seed(identity.private_seed())
    assert again.public_key_bytes == identity.public_key_bytes
    signature = identity.sign(b"hello")
    assert verify_signature(identity.public_key_bytes, signature, b"hello")
    assert not verify_signature(identity.public_key_bytes, signature, b"hellO")
    assert not verify_signature(b"\x00" * 31, signature, b"hello")  # hostile input never raises
    assert identity.private_seed().hex() not in repr(identity)


def test_peer_id_matches_libp2p():
    from libp2p.crypto.ed25519 import Ed25519PrivateKey as Libp2pPrivateKey
    from libp2p.crypto.keys import KeyPair
    from libp2p.peer.id import ID

    for _ in range(5):
        identity = NodeIdentity.generate()
        # The path the libp2p transport takes: our seed becomes its host key.
        private = Libp2pPrivateKey.from_bytes(identity.private_seed())
        key_pair = KeyPair(private, private.get_public_key())
        expected = ID.from_pubkey(key_pair.public_key).to_base58()
        assert identity.peer_id() == expected
        assert expected.startswith("12D3KooW")
        # ...and signatures made on either side verify on the other.
        assert key_pair.public_key.verify(b"x", identity.sign(b"x"))
        assert verify_signature(identity.public_key_bytes, private.sign(b"y"), b"y")


def test_base58_and_peer_id_edge_cases():
    assert base58btc(b"") == ""
    assert base58btc(b"\x00\x00\x01") == "112"
    assert base58btc(b"hello world") == "StV1DL6CwTryKyV"  # well-known test vector
    with pytest.raises(ValueError):
        peer_id_from_public_key(b"short")
