"""Schemathesis over the service's own OpenAPI schema, against a real `coordinator serve` on each
store: no input produces a 5xx, every answer matches the schema (status, content type, body), and
input the schema forbids is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support import ServiceProcess, create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("schema")
    if request.param == "sqlite":
        url = f"sqlite:///{workdir / 'schema.db'}"
        drop = None
    else:
        url = create_postgres_database()
        drop = url
    service = ServiceProcess(url, Path(workdir)).start()
    try:
        # Something to find, so not every call is a 404.
        httpx.post(f"{service.url}/v1/topics", json={"name": "t", "partitions": 2})
        httpx.post(f"{service.url}/v1/init-pid", json={"transactional_id": "tx"})
        yield service.url
    finally:
        service.stop()
        if drop:
            drop_postgres_database(drop)


@pytest.fixture(scope="module")
def api_schema(live_service: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{live_service}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_input_gives_a_5xx_and_every_answer_matches_the_schema(case: schemathesis.Case) -> None:
    response = case.call(timeout=30)
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            negative_data_rejection,
        ],
    )
