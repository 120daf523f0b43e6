"""The client side of a SASL/SCRAM login over Kafka's protocol (SaslHandshake 1, then
SaslAuthenticate), with SCRAM extensions such as Kafka's `tokenauth=true`: what Kafka's Java
client's ScramLoginModule sends, for tests that speak to the listener byte by byte."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from kio.schema.errors import ErrorCode

from tests.support.kafka_wire import Connection

_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


async def scram_login(
    connection: Connection,
    mechanism: str,
    user: str,
    password: str,
    **extensions: str,
) -> ErrorCode:
    """Log `connection` in; the error code of the exchange's last answer."""
    handshake = await connection.call(17, 1, mechanism=mechanism)
    if handshake.error_code != ErrorCode.none:
        code: ErrorCode = handshake.error_code
        return code
    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={user},r={nonce}" + "".join(f",{k}={v}" for k, v in extensions.items())
    first = await connection.call(36, 2, auth_bytes=f"n,,{bare}".encode())
    if first.error_code != ErrorCode.none:
        code = first.error_code
        return code
    server_first = bytes(first.auth_bytes).decode()
    attributes = dict(part.split("=", 1) for part in server_first.split(","))
    name = _HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(
        name, password.encode(), base64.b64decode(attributes["s"]), int(attributes["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", name)
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={attributes['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, name)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = await connection.call(
        36, 2, auth_bytes=f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    )
    code = final.error_code
    return code
