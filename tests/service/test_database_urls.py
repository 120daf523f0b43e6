"""The store's URL (issue 37, item 1): a Postgres URL may list several servers, in libpq's form
(`postgresql://u@a:5432,b:5432/db`) or SQLAlchemy's (`?host=a:5432&host=b:5432`), and the service
uses the first that answers; a URL that cannot be used stops the commands with one line naming
COORDINATOR_DATABASE_URL, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from coordinator.core.settings import ConfigurationError, load_settings, normalise_database_url
from tests.support.services import (
    ServiceProcess,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)


@pytest.mark.parametrize(
    ("given", "hosts", "query"),
    [
        ("postgresql://u:pw@a:5432,b:5433/db", ("a:5432", "b:5433"), {}),
        (
            "postgresql://u@a,b:7/db?target_session_attrs=read-write",
            ("a", "b:7"),
            {"target_session_attrs": "read-write"},
        ),
        (
            "postgresql://u@/db?host=a:5432&host=b:5432&target_session_attrs=read-write",
            ("a:5432", "b:5432"),
            {"target_session_attrs": "read-write"},
        ),
        ("postgres://u@[::1]:5432,b/db", ("[::1]:5432", "b"), {}),
    ],
)
def test_both_multi_host_forms_become_the_drivers_list(
    given: str, hosts: tuple[str, ...], query: dict[str, str]
) -> None:
    url = make_url(normalise_database_url(given))
    assert url.drivername == "postgresql+asyncpg"
    assert url.host is None and url.database == "db"
    assert url.query["host"] == hosts
    assert {k: v for k, v in url.query.items() if k != "host"} == query
    # Normalising is idempotent: worker processes read the normalised URL back.
    assert normalise_database_url(str(url.render_as_string(hide_password=False))) == str(
        url.render_as_string(hide_password=False)
    )


def test_a_password_and_a_single_host_are_kept_as_given() -> None:
    url = make_url(normalise_database_url("postgresql://u:p%40ss@h:6543/db?sslmode=disable"))
    assert (url.username, url.password, url.host, url.port) == ("u", "p@ss", "h", 6543)
    assert url.query == {"sslmode": "disable"}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("postgresql://u:secret@a:notaport/db", "its port is not a number"),
        ("postgresql://u@a:5432,b:x/db", "host 'b:x' of the URL: the port must be a number"),
        ("postgresql://u@a:1,,b/db", "a host of the URL's list is empty"),
        ("postgresql://u@a:70000/db", "port 70000 of the URL"),
        ("postgresql://u@a/db?host=b", "names a host both before its path and as host="),
        ("mysql://u@a/db", "unsupported database 'mysql'"),
        ("just-a-path", "not a database URL"),
    ],
)
def test_a_url_that_cannot_be_used_is_a_configuration_error(given: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_settings(database_url=given)
    assert str(raised.value).startswith("COORDINATOR_DATABASE_URL: ")
    assert said in str(raised.value)
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize("command", [["serve"], ["migrate"], ["scram", "list"]])
def test_the_commands_refuse_a_bad_url_in_one_line(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", *command],
        env={"COORDINATOR_DATABASE_URL": "postgresql://u:secret@a:5432,b:x/db", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "coordinator: configuration error: COORDINATOR_DATABASE_URL: host 'b:x' of the URL: "
        "the port must be a number from 1 to 65535"
    ]


@pytest.fixture(scope="module")
def postgres_database() -> Iterator[str]:
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


@pytest.mark.parametrize("form", ["libpq", "sqlalchemy"])
def test_the_service_runs_on_the_first_server_of_the_list_that_answers(
    form: str, postgres_database: str, tmp_path: Path
) -> None:
    """The first server of the list is down (nothing listens on its port): the service starts
    on the second, and serves a produce and a read."""
    live = make_url(postgres_database)
    down = f"127.0.0.1:{free_port()}"
    up = f"{live.host}:{live.port}"
    if form == "libpq":
        url = f"postgresql://{live.username}@{down},{up}/{live.database}"
    else:
        url = f"postgresql://{live.username}@/{live.database}?host={down}&host={up}"
    url += ("&" if "?" in url else "?") + "target_session_attrs=read-write"
    with ServiceProcess(url, tmp_path) as service, service.client(timeout=10) as client:
        created = client.post("/v1/topics", json={"name": form, "partitions": 1})
        assert created.status_code == 201, created.text
        produced = client.post(
            f"/v1/topics/{form}/partitions/0/records", json={"records": [{"value": "hi"}]}
        )
        assert produced.status_code == 200, produced.text
        read = client.get(f"/v1/topics/{form}/partitions/0/records", params={"offset": 0})
        assert [r["value"] for r in read.json()["records"]] == ["hi"]
