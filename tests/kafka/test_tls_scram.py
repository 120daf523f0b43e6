"""TLS through both doors and SASL/SCRAM on the Kafka listener (issue 21, item 6), on
`coordinator serve` with a certificate made here, SQLite and Postgres: HTTPS; confluent-kafka and
kcat over SASL_SSL with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN; wrong passwords refused;
credentials managed by `coordinator scram` and stored salted; client certificates required
where a client CA is given (mTLS)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import confluent_kafka.admin as cka
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.services import (
    ServiceProcess,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0
ADMIN = {"token": "admin-token-1", "principal": "ops", "roles": ["admin"]}
ALICE = {
    "token": "alice-token-1",
    "principal": "alice",
    "roles": ["producer", "consumer"],
    "transactional_id_prefixes": [""],
    "topic_prefixes": [""],
    "group_prefixes": [""],
}
PASSWORD = "alice-scram-secret"


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("test-ca", ca_key, "test-ca", ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca.public_bytes(pem))
    server = _issue("127.0.0.1", server_key, "test-ca", ca_key, server=True)
    (root / "server.pem").write_bytes(server.public_bytes(pem))
    client = _issue("alice", client_key, "test-ca", ca_key)
    (root / "client.pem").write_bytes(client.public_bytes(pem))
    return Pki(
        root / "ca.pem",
        root / "server.pem",
        _write_key(server_key, root / "server.key"),
        root / "client.pem",
        _write_key(client_key, root / "client.key"),
    )


@dataclass
class Broker:
    service: ServiceProcess
    bootstrap: str
    database_url: str


def _scram(database_url: str, *args: str, password: str | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "scram", *args, "--database-url", database_url],
        input=None if password is None else password + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _start(backend: str, root: Path, pki: Pki, *, mutual: bool) -> Iterator[Broker]:
    postgres = backend == "postgres"
    url = create_postgres_database() if postgres else f"sqlite:///{root / 'tls.db'}"
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [ADMIN, ALICE]}))
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        _scram(url, "set", "alice", "--mechanism", mechanism, "--password-stdin", password=PASSWORD)
    port = free_port()
    env = {
        "COORDINATOR_KAFKA_LISTENER": f"127.0.0.1:{port}",
        "COORDINATOR_AUTH_TOKENS_FILE": str(tokens),
        "COORDINATOR_TLS_CERT_FILE": str(pki.server_cert),
        "COORDINATOR_TLS_KEY_FILE": str(pki.server_key),
    }
    if mutual:
        env["COORDINATOR_TLS_CLIENT_CA_FILE"] = str(pki.ca)
    service = ServiceProcess(url, root, ca=pki.ca, **env)
    if mutual:
        service.client_cert = (str(pki.client_cert), str(pki.client_key))
    try:
        yield Broker(service.start(), f"127.0.0.1:{port}", url)
    finally:
        service.stop()
        if postgres:
            drop_postgres_database(url)
    assert "Traceback" not in service.log.read_text(errors="replace")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[Broker]:
    yield from _start(request.param, tmp_path_factory.mktemp("tls"), pki, mutual=False)


def _kafka_config(broker: Broker, pki: Pki, mechanism: str, password: str) -> dict[str, Any]:
    user = "alice"
    if mechanism == "PLAIN":
        password = ALICE["token"] if password == PASSWORD else password  # type: ignore[assignment]
    return {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(pki.ca),
    }


def _topic(broker: Broker) -> str:
    name = f"tls-{uuid.uuid4().hex[:8]}"
    with broker.service.client(headers={"Authorization": f"Bearer {ADMIN['token']}"}) as client:
        assert client.post("/v1/topics", json={"name": name}).status_code == 201
    return name


def test_http_is_served_over_tls_only(broker: Broker) -> None:
    with broker.service.client() as client:
        assert client.get("/healthz").status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{broker.service.port}/healthz", timeout=5)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_confluent_kafka_produces_and_consumes_over_sasl_ssl(
    broker: Broker, pki: Pki, mechanism: str
) -> None:
    topic = _topic(broker)
    config = _kafka_config(broker, pki, mechanism, PASSWORD)
    producer = ck.Producer({**config, "enable.idempotence": True})
    for i in range(3):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(DEADLINE_S) == 0
    consumer = ck.Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        while len(values) < 3:
            message = consumer.poll(DEADLINE_S)
            assert message is not None, f"only {values} within {DEADLINE_S} s"
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()
    assert values == [b"v0", b"v1", b"v2"]


def _first_error(config: dict[str, Any]) -> ck.KafkaError:
    """The first error a client reports (its error callback), waiting up to DEADLINE_S."""
    errors: list[ck.KafkaError] = []
    producer = ck.Producer({**config, "error_cb": errors.append})
    deadline = time.monotonic() + DEADLINE_S
    while not errors and time.monotonic() < deadline:
        producer.poll(0.1)
    assert errors, f"no error within {DEADLINE_S} s"
    return errors[0]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_scram_password_is_refused(broker: Broker, pki: Pki, mechanism: str) -> None:
    error = _first_error(_kafka_config(broker, pki, mechanism, "not-the-password"))
    assert error.code() == ck.KafkaError._AUTHENTICATION, error


def test_kcat_lists_and_produces_over_sasl_ssl_with_scram(broker: Broker, pki: Pki) -> None:
    topic = _topic(broker)
    options = [
        "-b",
        broker.bootstrap,
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        "sasl.mechanism=SCRAM-SHA-256",
        "-X",
        "sasl.username=alice",
        "-X",
        f"sasl.password={PASSWORD}",
        "-X",
        f"ssl.ca.location={pki.ca}",
    ]
    produced = subprocess.run(
        ["kcat", *options, "-P", "-t", topic],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    listed = subprocess.run(
        ["kcat", *options, "-L", "-J"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    assert topic in [t["topic"] for t in json.loads(listed.stdout)["topics"]]
    consumed = subprocess.run(
        ["kcat", *options, "-C", "-t", topic, "-e", "-o", "beginning"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert consumed.stdout.split() == ["one", "two"], consumed.stderr


def test_credentials_are_stored_salted_and_listed_without_keys(broker: Broker) -> None:
    listed = json.loads(_scram(broker.database_url, "list", "--json"))
    assert {(c["principal"], c["mechanism"]) for c in listed} == {
        ("alice", "SCRAM-SHA-256"),
        ("alice", "SCRAM-SHA-512"),
    }
    assert all(c["iterations"] >= 4096 for c in listed)
    assert PASSWORD not in json.dumps(listed)
    # Nothing in the store holds the password: only salts and derived keys.
    import asyncio

    from coordinator.core.scram import ScramCredential
    from coordinator.core.settings import Settings
    from coordinator.store.engines import open_store

    async def rows() -> list[bytes]:
        db = open_store(Settings(database_url=broker.database_url))
        try:
            async with db.read() as session:
                from sqlalchemy import select

                found = (await session.execute(select(ScramCredential))).scalars().all()
                return [r.salt + r.stored_key + r.server_key for r in found]
        finally:
            await db.dispose()

    stored = asyncio.run(rows())
    assert len(stored) == 2 and all(PASSWORD.encode() not in row for row in stored)


@pytest.fixture(scope="module")
def mutual_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    yield from _start("sqlite", tmp_path_factory.mktemp("mtls"), pki, mutual=True)


def test_mtls_requires_a_client_certificate_through_both_doors(
    mutual_broker: Broker, pki: Pki
) -> None:
    with mutual_broker.service.client() as client:
        assert client.get("/healthz").status_code == 200  # with the client certificate
    import ssl

    bare = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{mutual_broker.service.url}/healthz", verify=bare, timeout=5).raise_for_status()
    config = _kafka_config(mutual_broker, pki, "SCRAM-SHA-256", PASSWORD)
    with_cert = {
        **config,
        "ssl.certificate.location": str(pki.client_cert),
        "ssl.key.location": str(pki.client_key),
    }
    assert _topic(mutual_broker) in cka.AdminClient(with_cert).list_topics(timeout=20).topics
    # Without a certificate the TLS handshake fails: the client never gets to SASL.
    error = _first_error(config)
    refused = (ck.KafkaError._SSL, ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN)
    assert error.code() in refused, error
