"""The SCRAM exchange as Kafka's broker runs it (coordinator.core.scram): RFC 7677's test
vector, Kafka's tolerance of a client nonce sent twice (older librdkafka), and refusals that do
not say which part was wrong."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from coordinator.core import scram

# RFC 7677, section 3.
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
NONCE = "rOprNGfwEbeRWgbNEkqO" + SERVER_NONCE
CLIENT_FINAL = f"c=biws,r={NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def server(password: str = "pencil") -> scram.ScramServer:
    stored, server_key = scram.derive("SCRAM-SHA-256", password, SALT, 4096)
    first = scram.client_first(CLIENT_FIRST)
    return scram.ScramServer(
        "SCRAM-SHA-256", first, (SALT, stored, server_key, 4096), server_nonce=SERVER_NONCE
    )


def test_rfc_7677_test_vector() -> None:
    exchange = server()
    assert exchange.server_first == f"r={NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert exchange.final(CLIENT_FINAL) == SERVER_FINAL


def signed(without_proof: str, password: str = "pencil") -> str:
    """A client-final message with the proof a client knowing `password` computes."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored = hashlib.sha256(client_key).digest()
    auth = f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
    signature = hmac.digest(stored, (auth + without_proof).encode(), "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


def test_the_proof_helper_agrees_with_the_rfc() -> None:
    assert signed(f"c=biws,r={NONCE}") == CLIENT_FINAL


def test_a_client_nonce_sent_twice_is_taken_as_kafka_takes_it() -> None:
    # An older librdkafka (Debian's kcat) prefixes its own nonce once more; Kafka asks only
    # that the client's nonce end with the server's.
    doubled = signed(f"c=biws,r=rOprNGfwEbeRWgbNEkqO{NONCE}")
    assert server().final(doubled).startswith("v=")
    with pytest.raises(scram.ScramFailed, match="nonce"):
        server().final(signed(f"c=biws,r={NONCE[:-3]}abc"))


@pytest.mark.parametrize(
    "final",
    [
        CLIENT_FINAL.replace("p=dHzb", "p=AAAA"),  # a wrong proof
        CLIENT_FINAL.replace("c=biws", "c=eSws"),  # another GS2 header
        f"c=biws,r={NONCE}",  # no proof
        CLIENT_FINAL.replace("p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "p=!!"),
    ],
)
def test_a_bad_client_final_is_refused(final: str) -> None:
    with pytest.raises(scram.ScramFailed):
        server().final(final)


def test_a_wrong_password_is_refused() -> None:
    with pytest.raises(scram.ScramFailed, match="invalid credentials"):
        server("not-pencil").final(CLIENT_FINAL)


@pytest.mark.parametrize("first", ["p=tls-unique,,n=u,r=x", "n,,r=x", "n,,n=u", "garbage"])
def test_a_bad_client_first_is_refused(first: str) -> None:
    with pytest.raises(scram.ScramFailed):
        scram.client_first(first)
