"""Schemathesis over the service's own OpenAPI schema, against a real `coordinator serve` on each
store: no input produces a 5xx, every answer matches the schema (status, content type, body), and
input the schema forbids is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.services import ServiceProcess, create_postgres_database, drop_postgres_database

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


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


# Schemathesis's core API (operations as hypothesis strategies) rather than its pytest plugin,
# which reaches into pytest's internals and breaks with new pytest releases.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_gives_a_5xx_and_every_answer_matches_the_schema(
    live_service: str, mode: GenerationMode
) -> None:
    api_schema = schemathesis.openapi.from_url(f"{live_service}/openapi.json")
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15, "the schema lost its operations"
    exercised: list[str] = []
    for operation in operations:
        negatable = any(True for _ in operation.iter_parameters()) or bool(
            operation.get_request_payload_content_types()
        )
        if mode is GenerationMode.NEGATIVE and not negatable:
            continue  # no parameter and no body: no input to get wrong

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def call_and_check(case: schemathesis.Case) -> None:
            response = case.call(timeout=30)
            case.validate_response(response, checks=CHECKS)

        try:
            call_and_check()
        except Unsatisfiable:
            # Schemathesis cannot write wrong input for this operation (e.g. its only input is an
            # unconstrained string in the path); its plugin marks those skipped.
            assert mode is GenerationMode.NEGATIVE, operation.label
            continue
        exercised.append(operation.label)
    assert len(exercised) >= 10, exercised
