"""SASL/SCRAM credentials (RFC 5802, 7677) for the Kafka listener: SCRAM-SHA-256 and
SCRAM-SHA-512, as Kafka's broker offers them. Only the salted keys are stored (salt, StoredKey,
ServerKey, iterations), never the password; `coordinator scram` manages them. A SCRAM login
proves a principal's name; its roles and prefixes are the tokens file's for that principal.

The exchange is written here, as Kafka's ScramSaslServer runs it, rather than taken from a
library: Kafka accepts a client-final nonce that ends with the server's (librdkafka before 2.x
sends the client nonce twice, and Debian's kcat is built on it), where RFC-strict servers such as
scramp refuse it; and Kafka derives keys from the password's UTF-8 bytes without SASLprep, so
credentials set here verify exactly where Kafka's would.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass, field

from sqlalchemy import Integer, LargeBinary, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base
from coordinator.store import Store

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's minimum is 4096 iterations; its tool's default is 4096 too.
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096
# And its maximum (ScramMechanism's), which its tools and AlterUserScramCredentials enforce.
MAX_ITERATIONS = 16384


class ScramCredential(Base):
    __tablename__ = "scram_credentials"

    principal: Mapped[str] = mapped_column(String(255), primary_key=True)
    mechanism: Mapped[str] = mapped_column(String(16), primary_key=True)
    salt: Mapped[bytes] = mapped_column(LargeBinary)
    stored_key: Mapped[bytes] = mapped_column(LargeBinary)
    server_key: Mapped[bytes] = mapped_column(LargeBinary)
    iterations: Mapped[int] = mapped_column(Integer)


@dataclass(frozen=True)
class Listed:
    principal: str
    mechanism: str
    iterations: int


def _check(mechanism: str, iterations: int) -> None:
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism {mechanism!r}: one of {', '.join(MECHANISMS)}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations {iterations}: {MIN_ITERATIONS} to {MAX_ITERATIONS}")


async def set_credential(
    db: Store, principal: str, mechanism: str, password: str, iterations: int
) -> None:
    """Store (or replace) the principal's credential for `mechanism`, salted anew."""
    _check(mechanism, iterations)
    if not principal or not password:
        raise ValueError("a principal and a password are needed")
    salt = os.urandom(32)
    stored_key, server_key = derive(mechanism, password, salt, iterations)
    await _store(db, principal, mechanism, salt, stored_key, server_key, iterations)


async def set_salted(
    db: Store,
    principal: str,
    mechanism: str,
    salt: bytes,
    salted_password: bytes,
    iterations: int,
) -> None:
    """Store (or replace) a credential given as Kafka's AlterUserScramCredentials gives it: the
    salt and the SaltedPassword the client derived (the password never travels)."""
    _check(mechanism, iterations)
    if not principal or not salt or not salted_password:
        raise ValueError("a principal, a salt and a salted password are needed")
    stored_key, server_key = keys_of(mechanism, salted_password)
    await _store(db, principal, mechanism, salt, stored_key, server_key, iterations)


async def _store(
    db: Store,
    principal: str,
    mechanism: str,
    salt: bytes,
    stored_key: bytes,
    server_key: bytes,
    count: int,
) -> None:
    async with db.write() as session:
        await session.execute(
            delete(ScramCredential).where(
                ScramCredential.principal == principal, ScramCredential.mechanism == mechanism
            )
        )
        session.add(
            ScramCredential(
                principal=principal,
                mechanism=mechanism,
                salt=salt,
                stored_key=stored_key,
                server_key=server_key,
                iterations=count,
            )
        )


async def delete_credential(db: Store, principal: str, mechanism: str) -> bool:
    async with db.write() as session:
        deleted = await session.execute(
            delete(ScramCredential)
            .where(ScramCredential.principal == principal, ScramCredential.mechanism == mechanism)
            .returning(ScramCredential.principal)
        )
        return deleted.first() is not None


async def list_credentials(db: Store) -> list[Listed]:
    async with db.read() as session:
        rows = await session.execute(
            select(
                ScramCredential.principal, ScramCredential.mechanism, ScramCredential.iterations
            ).order_by(ScramCredential.principal, ScramCredential.mechanism)
        )
        return [Listed(*row) for row in rows]


async def lookup(
    db: Store, principal: str, mechanism: str
) -> tuple[bytes, bytes, bytes, int] | None:
    """scramp's auth info (salt, StoredKey, ServerKey, iterations), or None."""
    async with db.read() as session:
        row = await session.get(ScramCredential, (principal, mechanism))
        if row is None:
            return None
        return row.salt, row.stored_key, row.server_key, row.iterations


def derive(mechanism: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """StoredKey and ServerKey (RFC 5802) of a password, from its UTF-8 bytes as Kafka does."""
    name = _HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(name, password.encode("utf-8"), salt, iterations)
    return keys_of(mechanism, salted)


def hash_of(mechanism: str) -> str:
    """hashlib's name of a mechanism's hash."""
    return _HASHES[mechanism]


def keys_of(mechanism: str, salted_password: bytes) -> tuple[bytes, bytes]:
    """StoredKey and ServerKey (RFC 5802) of a SaltedPassword."""
    name = _HASHES[mechanism]
    client_key = hmac.digest(salted_password, b"Client Key", name)
    return hashlib.new(name, client_key).digest(), hmac.digest(salted_password, b"Server Key", name)


class ScramFailed(Exception):
    """The exchange failed; the message does not say which part was wrong."""


def _attributes(message: str, extensions: bool = False) -> dict[str, str]:
    """A SCRAM message's attributes; with `extensions`, names longer than a letter too (Kafka's
    SCRAM extensions, such as `tokenauth=true`, follow the client-first message's nonce)."""
    found: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key or (len(key) != 1 and not extensions):
            raise ScramFailed("a malformed SCRAM message")
        found.setdefault(key, value)
    return found


@dataclass
class ClientFirst:
    user: str
    nonce: str
    bare: str  # the message without its GS2 header, as signed
    header: str
    extensions: dict[str, str] = field(default_factory=dict)

    @property
    def token_auth(self) -> bool:
        """A delegation token's login (Kafka's `tokenauth` extension): the user is its id."""
        return self.extensions.get("tokenauth", "").lower() == "true"


def client_first(message: str) -> ClientFirst:
    """Parse `n,,n=user,r=nonce[,extensions]`; channel binding (`p=`) is not offered."""
    if not message.startswith(("n,", "y,")):
        raise ScramFailed("SCRAM without channel binding only (n or y GS2 flag)")
    flag, _, rest = message.partition(",")
    authzid, _, bare = rest.partition(",")
    attributes = _attributes(bare, extensions=True)
    user = attributes.pop("n", "").replace("=2C", ",").replace("=3D", "=")
    nonce = attributes.pop("r", "")
    if not user or not nonce:
        raise ScramFailed("a SCRAM client-first message needs n= and r=")
    return ClientFirst(user, nonce, bare, f"{flag},{authzid},", attributes)


class ScramServer:
    """The server side of one exchange, for a credential already looked up."""

    def __init__(
        self,
        mechanism: str,
        first: ClientFirst,
        credential: tuple[bytes, bytes, bytes, int],
        server_nonce: str | None = None,  # random unless a test gives RFC 7677's
    ) -> None:
        self._hash = _HASHES[mechanism]
        self._first = first
        self._salt, self._stored_key, self._server_key, self._iterations = credential
        self._nonce = first.nonce + (server_nonce or base64.b64encode(os.urandom(24)).decode())
        self.server_first = (
            f"r={self._nonce},s={base64.b64encode(self._salt).decode()},i={self._iterations}"
        )

    def final(self, message: str) -> str:
        """Check the client's proof; the server-final message (`v=` its signature)."""
        without_proof, sep, proof = message.rpartition(",p=")
        if not sep:
            raise ScramFailed("a SCRAM client-final message needs p=")
        attributes = _attributes(without_proof)
        expected_binding = base64.b64encode(self._first.header.encode()).decode()
        if attributes.get("c") != expected_binding:
            raise ScramFailed("channel binding does not match the GS2 header")
        # Kafka's check: the client's nonce ends with the server's (an older librdkafka
        # prefixes its own nonce once more).
        if not attributes.get("r", "").endswith(self._nonce):
            raise ScramFailed("the client-final nonce is not the server's")
        auth_message = f"{self._first.bare},{self.server_first},{without_proof}".encode()
        signature = hmac.digest(self._stored_key, auth_message, self._hash)
        try:
            client_proof = base64.b64decode(proof, validate=True)
        except ValueError:
            raise ScramFailed("the client proof is not base64") from None
        if len(client_proof) != len(signature):
            raise ScramFailed("invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(client_proof, signature, strict=True))
        stored = hashlib.new(self._hash, client_key).digest()
        if not hmac.compare_digest(stored, self._stored_key):
            raise ScramFailed("invalid credentials")
        server_signature = hmac.digest(self._server_key, auth_message, self._hash)
        return "v=" + base64.b64encode(server_signature).decode()
