"""A node's long-lived identity: one Ed25519 key for both layers.

The same key signs our envelopes and (through its 32-byte seed) becomes the libp2p host key, so a
node's libp2p peer id and the `sender_public_key` of its envelopes name the same party.

Key file: unencrypted PKCS#8 PEM ("-----BEGIN PRIVATE KEY-----", readable by openssl), mode 0600,
written atomically. Like ssh, `load` refuses a key file that group or others can read.
"""
from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.ground import atomic_write_bytes

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
KEY_FILE_MODE = 0o600


class IdentityError(Exception):
    """A key file that is missing, corrupt, of the wrong key type or readable by others."""


class NodeIdentity:
    """An Ed25519 key pair. `sign`, `public_key_bytes`, `peer_id()`; `private_seed()` for the
    libp2p transport only."""

    __slots__ = ("_private_key", "_public_key_bytes")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self._public_key_bytes = private_key.public_key().public_bytes_raw()

    @classmethod
    def generate(cls) -> NodeIdentity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> NodeIdentity:
        """From the raw 32-byte private seed (the inverse of `private_seed()`)."""
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    @property
    def public_key_bytes(self) -> bytes:
        """Raw 32-byte Ed25519 public key (what envelopes carry as sender_public_key)."""
        return self._public_key_bytes

    def private_seed(self) -> bytes:
        """Raw 32-byte private seed. Secret: only for building the libp2p host key
        (libp2p.crypto.ed25519.Ed25519PrivateKey.from_bytes(seed))."""
        return self._private_key.private_bytes_raw()

    def peer_id(self) -> str:
        """The libp2p peer id of this key ("12D3KooW...")."""
        return peer_id_from_public_key(self._public_key_bytes)

    def sign(self, data: bytes) -> bytes:
        return self._private_key.sign(data)

    def __repr__(self) -> str:  # never print the secret
        return f"NodeIdentity({self.peer_id()})"

    # --- key file ---------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Writes the key as PKCS#8 PEM with mode 0600: temp file in the same folder, chmod,
        fsync, then rename, so a crash leaves either the old file or the new one, never half a
        key. Refuses to replace an existing file unless `overwrite` (losing a key loses the
        node's reputation with its peers)."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True to replace the identity")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        pem = self._private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        atomic_write_bytes(path, pem, KEY_FILE_MODE)  # the mode is set before any secret byte is written

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NodeIdentity:
        path = Path(path)
        try:
            info = path.stat()
            data = path.read_bytes()
        except FileNotFoundError:
            raise IdentityError(f"identity file {path} does not exist (create one with NodeIdentity.generate().save())") from None
        except OSError as exc:
            raise IdentityError(f"cannot read identity file {path}: {exc}") from exc
        if os.name == "posix" and stat.S_IMODE(info.st_mode) & 0o077:
            raise IdentityError(
                f"identity file {path} has mode {stat.S_IMODE(info.st_mode):04o}: others can read the "
                f"private key; run `chmod 600 {path}` (and consider the key leaked if it was shared)"
            )
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise IdentityError(f"identity file {path} is not an unencrypted PEM private key: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"identity file {path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    @classmethod
    def load_or_generate(cls, path: str | os.PathLike[str]) -> NodeIdentity:
        """Loads `path`, or creates a new identity there if the file does not exist."""
        if Path(path).exists():
            return cls.load(path)
        identity = cls.generate()
        identity.save(path)
        return identity


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True iff `signature` is a valid Ed25519 signature of `data` by `public_key` (raw 32 bytes).
    Never raises on hostile input."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


# --- libp2p peer ids (https://github.com/libp2p/specs/blob/master/peer-ids/peer-ids.md) ------------
#
# peer id = base58btc( multihash ), multihash = identity code 0x00, varint length, then the key's
# protobuf encoding  PublicKey { KeyType Type = 1; bytes Data = 2; }  with Type Ed25519 = 1.
# Keys whose encoding is at most 42 bytes are inlined (identity hash); Ed25519's is 36 bytes.

_ED25519_KEY_TYPE = 1
_IDENTITY_MULTIHASH = 0x00
_BASE58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def base58btc(data: bytes) -> str:
    zeros = len(data) - len(data.lstrip(b"\0"))
    number = int.from_bytes(data, "big")
    digits = []
    while number:
        number, rest = divmod(number, 58)
        digits.append(_BASE58_ALPHABET[rest])
    return "1" * zeros + "".join(reversed(digits))


@functools.lru_cache(maxsize=4096)  # bounded: one entry per recently seen sender
def peer_id_from_public_key(public_key: bytes) -> str:
    """libp2p peer id string of a raw 32-byte Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    encoded_key = (
        bytes([0x08, _ED25519_KEY_TYPE])  # field 1 (Type), varint
        + bytes([0x12]) + _varint(len(public_key)) + bytes(public_key)  # field 2 (Data), bytes
    )
    multihash = bytes([_IDENTITY_MULTIHASH]) + _varint(len(encoded_key)) + encoded_key
    return base58btc(multihash)
