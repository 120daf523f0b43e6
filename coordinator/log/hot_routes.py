"""The data path's two routes without FastAPI's per-request machinery: a record-batch produce and
a record-batch fetch.

FastAPI resolves each route's dependencies and validates its parameters anew on every request:
on the append path that was a quarter of the service's CPU (bench/produce.py, 16 producers:
17.4 to 19.3 ms of service CPU per MB through FastAPI's route, 12.9 to 14.9 through this one,
and 0.38 to 0.42 of raw INSERT's MB/s against 0.49 to 0.50). A `HotRoute` stands in front of
the FastAPI route of the same path and takes a request only when it is plainly its own: the
method, the media type, and path and query parameters that the route's own signature (its annotated
types and defaults, applied here with pydantic's TypeAdapter) accepts. Anything else (a JSON body, a
parameter the route would refuse, another method) does not match it, so FastAPI's route answers
as it always has, errors included. What a matched request does is `routes.py`'s, written once:
the same authentication, the same domain calls, the same answers; errors raised here meet the
app's handlers like any route's, and the metrics label it with the same route template.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints
from urllib.parse import parse_qsl

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from coordinator.core.auth import authenticate
from coordinator.log import routes

RECORDS = "/v1/topics/{topic}/partitions/{partition}/records"
# The request's checked arguments, under this key of its scope.
ARGUMENTS = "coordinator.hot_arguments"

# A request's path and query parameters: name -> (its type's validator, its default). A name
# whose default is `inspect.Parameter.empty` must be present.
_Parameters = dict[str, tuple[TypeAdapter[Any], Any]]
_REQUIRED = inspect.Parameter.empty


def _parameters(endpoint: Callable[..., Any], *names: str) -> _Parameters:
    """The named parameters of a FastAPI route's endpoint, with the types and defaults its
    signature declares: the route's own rules, applied by pydantic as FastAPI applies them."""
    hints = get_type_hints(endpoint, include_extras=True)
    declared = inspect.signature(endpoint).parameters
    return {name: (TypeAdapter(hints[name]), declared[name].default) for name in names}


_PATH = _parameters(routes.produce, "topic", "partition")
_PRODUCE_QUERY = _parameters(routes.produce, "transactional_id")
_FETCH_QUERY = _parameters(
    routes.fetch, "offset", "max_records", "max_bytes", "isolation_level", "encoding"
)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lowercase), as Starlette's `Headers.get` reads it."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _checked(values: dict[str, str], parameters: _Parameters) -> dict[str, Any] | None:
    """The parameters validated by their route's types, defaults filled in; None when one is
    missing or refused (the FastAPI route then says why)."""
    checked = {}
    for name, (adapter, default) in parameters.items():
        if name in values:
            try:
                checked[name] = adapter.validate_python(values[name])
            except ValidationError:
                return None
        elif default is _REQUIRED:
            return None
        else:
            checked[name] = default
    return checked


def _query(scope: Scope) -> dict[str, str] | None:
    """The query string's parameters (decoded as Starlette decodes them); None when one is
    given twice, which the FastAPI route resolves its own way."""
    pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
    values = dict(pairs)
    return values if len(values) == len(pairs) else None


def _arguments(
    scope: Scope, path_params: dict[str, str], query: _Parameters
) -> dict[str, Any] | None:
    values = _query(scope)
    if values is None:
        return None
    in_path = _checked(path_params, _PATH)
    in_query = _checked(values, query)
    return None if in_path is None or in_query is None else in_path | in_query


def _produce_arguments(scope: Scope, path_params: dict[str, str]) -> dict[str, Any] | None:
    if scope["method"] != "POST" or not routes.is_record_batch(_header(scope, b"content-type")):
        return None
    return _arguments(scope, path_params, _PRODUCE_QUERY)


def _fetch_arguments(scope: Scope, path_params: dict[str, str]) -> dict[str, Any] | None:
    if scope["method"] != "GET" or not routes.wants_batches(_header(scope, b"accept")):
        return None
    arguments = _arguments(scope, path_params, _FETCH_QUERY)
    if arguments is None:
        return None
    # Checked, as the route checks them, but a fetch of record batches has no use for them.
    del arguments["max_records"], arguments["encoding"]
    return arguments


class HotRoute(Route):
    """A route that matches only the requests `arguments` checks (returning the endpoint's
    keyword arguments); any other request goes on to the routes after it."""

    def __init__(
        self,
        path: str,
        endpoint: Callable[[Request], Any],
        arguments: Callable[[Scope, dict[str, str]], dict[str, Any] | None],
        method: str,
    ) -> None:
        super().__init__(path, endpoint, methods=[method], include_in_schema=False)
        self._arguments = arguments

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.FULL:
            return Match.NONE, {}
        arguments = self._arguments(scope, child_scope["path_params"])
        if arguments is None:
            return Match.NONE, {}
        # "route" as FastAPI's routes set it (its router does not, for a Starlette route): the
        # metrics label a request with its route's template.
        return Match.FULL, {**child_scope, "route": self, ARGUMENTS: arguments}


async def _produce(request: Request) -> Response:
    state = request.app.state
    return await routes.produce_batch(
        state.db,
        state.settings,
        authenticate(request),
        body=await request.body(),
        **request.scope[ARGUMENTS],
    )


async def _fetch(request: Request) -> Response:
    state = request.app.state
    return await routes.fetch_batches(
        state.db, state.settings, authenticate(request), **request.scope[ARGUMENTS]
    )


def hot_routes() -> list[Route]:
    """The routes to place before the app's others (before FastAPI's of the same path)."""
    return [
        HotRoute(RECORDS, _produce, _produce_arguments, "POST"),
        HotRoute(RECORDS, _fetch, _fetch_arguments, "GET"),
    ]
