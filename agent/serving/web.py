"""The web page at `/`: a branching chat, built from `web/` (Vite, React, assistant-ui) into `web_assets/`.

The page is static files that speak only the public HTTP API (`POST /responses` with `custom_inputs`
actions, streamed turns): it is one more client, with the same ownership checks as any other.
Nothing here reads a thread. The built files ship inside the package (`web_assets/`, package data),
so `pip install` users need no Node; `scripts/check_web_build.sh` rebuilds them from `web/`'s
lockfile and fails when they differ from what is shipped.

Routes (none of them touches the agent's data):

* `GET /` the page (`index.html`); the thread and the head it shows are in its query string
  (`/?thread=...&head=...`), so one route serves every link and a reload shows the same thing.
* `GET /assets/...` its scripts and styles (content-hashed names: cached for a year).
* `GET /web/identity` who the page acts as: with `user_id_header` set, the header's name and the
  caller's own value (as the proxy sent it); without it, `header` null (one local user). It echoes
  what the caller sent and reads nothing else.

When `web_assets/` has no `index.html` (a source checkout whose page was never built), `GET /`
answers 404 with a sentence saying how to build it; the API is unaffected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel
from starlette.staticfiles import StaticFiles

#: Where the built page lives inside the package.
ASSETS_DIR = Path(__file__).with_name("web_assets")

#: Hashed asset names never change content: a year of caching (the page itself is never cached).
ASSET_CACHE = "public, max-age=31536000, immutable"


class WebIdentity(BaseModel):
    """`GET /web/identity`: who the page acts as."""

    header: str | None
    """The `user_id_header` setting (None: no header, one local user)."""
    user_id: str | None
    """The header's value in this request (None when the setting is off or the header is absent)."""


class _CachedAssets(StaticFiles):
    async def get_response(self, path: str, scope: Any) -> Any:
        response = await super().get_response(path, scope)
        if response.status_code == 200:
            response.headers["cache-control"] = ASSET_CACHE
        return response


def mount_web_page(app: FastAPI, user_id_header: str | None) -> None:
    """Add the routes of the module docstring to `app` (`serving.agent_server.build_app` does, for every server)."""
    index = ASSETS_DIR / "index.html"
    if (ASSETS_DIR / "assets").is_dir():
        app.mount("/assets", _CachedAssets(directory=ASSETS_DIR / "assets"), name="web-assets")

    @app.get("/", include_in_schema=False)
    async def web_page() -> Any:
        if not index.is_file():
            return JSONResponse(
                {"error_code": "RESOURCE_DOES_NOT_EXIST",
                 "message": "The web page is not built in this checkout: run scripts/check_web_build.sh --update."},
                status_code=404,
            )  # fmt: skip
        return FileResponse(index, headers={"cache-control": "no-cache"})

    @app.get("/web/identity")
    async def web_identity(request: Request) -> WebIdentity:
        """Who the page acts as: the `user_id_header` name and this request's value of it (module docstring)."""
        if not user_id_header:
            return WebIdentity(header=None, user_id=None)
        return WebIdentity(header=user_id_header, user_id=request.headers.get(user_id_header) or None)
