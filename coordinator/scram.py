"""SCRAM credentials (RFC 5802, Kafka's KIP-84 / KIP-554), as the metadata log keeps them.

A credential is what the server needs to verify a SCRAM client without knowing its
password: the salt, the iteration count, StoredKey = H(HMAC(SaltedPassword, "Client
Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"). Kafka's admin client salts
the password itself and sends (salt, SaltedPassword, iterations) in
AlterUserScramCredentials; the controller derives the two keys from SaltedPassword
(ScramControlManager.finishUpsertion) and stores only those. The same here: no password
and no salted password is ever stored, logged or returned, and `repr` of a credential
hides all but the iteration count.

The mechanisms and their ids are Kafka's (clients.admin.ScramMechanism): SCRAM-SHA-256
is 1, SCRAM-SHA-512 is 2; iterations must lie in [4096, 16384] (ScramMechanism's minimum,
ScramControlManager's maximum).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
# Mechanism name -> (Kafka's type id, hashlib name).
MECHANISMS: dict[str, tuple[int, str]] = {
    SCRAM_SHA_256: (1, "sha256"),
    SCRAM_SHA_512: (2, "sha512"),
}
MECHANISM_BY_TYPE: dict[int, str] = {t: name for name, (t, _) in MECHANISMS.items()}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096  # kafka-configs.sh's default for `SCRAM-SHA-*=[password=...]`
# The shortest salt a login can use (scramp's Salt.MIN_LENGTH). Kafka takes any salt;
# its clients make 20 bytes or more, and a shorter one is refused when it is stored
# rather than failing every login later.
MIN_SALT_BYTES = 12


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """One user's credential for one mechanism: never a password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:
        return f"ScramCredential(<hidden>, iterations={self.iterations})"

    def to_record(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
            "iterations": self.iterations,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> ScramCredential:
        return cls(
            base64.b64decode(data["salt"]),
            base64.b64decode(data["stored_key"]),
            base64.b64decode(data["server_key"]),
            int(data["iterations"]),
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _hash_name(mechanism: str) -> str:
    return MECHANISMS[mechanism][1]


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(password, salt, i): PBKDF2 with the mechanism's HMAC. The password
    is taken as UTF-8, as Kafka's ScramFormatter does (no SASLprep)."""
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password.encode("utf-8"), salt, iterations)


def credential_from_salted(
    mechanism: str, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    """The stored credential of a SaltedPassword (RFC 5802 section 3)."""
    name = _hash_name(mechanism)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return ScramCredential(salt, stored_key, server_key, iterations)


def credential_from_password(
    mechanism: str, password: str, salt: bytes, iterations: int
) -> ScramCredential:
    return credential_from_salted(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
    )


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    """An AlterUserScramCredentials upsertion: the client's salt and SaltedPassword."""

    user: str
    mechanism: int  # Kafka's type id: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512, else unknown
    iterations: int
    salt: bytes
    salted_password: bytes

    def __repr__(self) -> str:
        return (
            f"ScramUpsertion({self.user!r}, {self.mechanism}, iterations={self.iterations}, "
            "<hidden>)"
        )


@dataclass(frozen=True, slots=True)
class ScramDeletion:
    user: str
    mechanism: int
