"""The operator's dashboard at `/dashboard`: one page of plain HTML, JS and CSS shipped inside the
package (no CDN, no build step) that reads the admin API and refreshes itself.

With auth on the page needs an admin principal: a bearer header, or the session cookie that
`/dashboard/login` sets from a token typed into the sign-in form. The cookie alone may only read;
the page's Abort also sends `x-coordinator-dashboard`, which a cross-site form cannot send.
"""

from __future__ import annotations

import html
from functools import cache
from importlib.resources import files
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Path, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from coordinator.core.auth import SESSION_COOKIE, Authenticator, authenticate
from coordinator.core.dependencies import AppSettings
from coordinator.core.errors import ClusterAuthorizationFailed, NotFound, Unauthenticated

router = APIRouter(tags=["dashboard"])

ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

# Nothing on these pages comes from anywhere but this service, and no markup is ever built from
# data (the script sets text only): a strict policy costs nothing.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


@cache
def _static(name: str) -> str:
    return files("coordinator.admin").joinpath("static", name).read_text("utf-8")


def _page(name: str, status_code: int = 200, **values: str) -> HTMLResponse:
    text = _static(name)
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", html.escape(value))
    return HTMLResponse(text, status_code, headers=PAGE_HEADERS)


def _sign_in(message: str = "") -> HTMLResponse:
    return _page("signin.html", 401, message=message)


def _forbidden(message: str) -> HTMLResponse:
    return _page("forbidden.html", 403, message=message)


@router.get(
    "/dashboard",
    response_class=HTMLResponse,
    responses={
        401: {"description": "No admin token: the sign-in form", "content": {"text/html": {}}},
        403: {"description": "The token lacks the admin role", "content": {"text/html": {}}},
    },
)
async def dashboard(request: Request, settings: AppSettings) -> Response:
    """The HTML dashboard (admin only where auth is on; without a token, a sign-in form)."""
    try:
        authenticate(request).cluster()
    except Unauthenticated:
        stale = SESSION_COOKIE in request.cookies
        return _sign_in("The saved token is no longer accepted; sign in again." if stale else "")
    except ClusterAuthorizationFailed as error:
        return _forbidden(error.detail)
    return _page(
        "dashboard.html",
        auth="off" if request.app.state.authenticator is None else "on",
        # Hanging means older than the largest timeout any producer may have asked for.
        hanging_ms=str(settings.transaction_max_timeout_ms),
    )


@router.post("/dashboard/login", include_in_schema=False)
async def login(request: Request) -> Response:
    """Check the form's token (admin role required) and keep it in the session cookie."""
    authenticator: Authenticator | None = request.app.state.authenticator
    if authenticator is None:
        return RedirectResponse("/dashboard", status_code=303)
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
    token = (form.get("token") or [""])[0].strip()
    principal = authenticator.principal(token) if token else None
    if principal is None:
        return _sign_in("That token is not known." if token else "Enter a token.")
    try:
        authenticator.access(principal, request.client.host if request.client else "").cluster()
    except ClusterAuthorizationFailed as error:
        return _forbidden(error.detail)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        token,
        httponly=True,
        samesite="strict",
        path="/",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/dashboard/logout", include_in_schema=False)
async def logout() -> Response:
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/dashboard/assets/{name}", include_in_schema=False)
async def asset(name: Annotated[str, Path(max_length=64)]) -> Response:
    """The page's script and stylesheet: public, they hold no data."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no asset {name!r}")
    return Response(
        _static(name),
        media_type=media_type,
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
