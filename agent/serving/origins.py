"""`BrowserGuard`: ASGI middleware that refuses what a page on another site makes a browser send.

CORS (`cors_origins`, Starlette's `CORSMiddleware`) only decides whether a page
may *read* an answer. A browser still *sends* a "simple" cross-origin request
without asking first: a form post, or `fetch(url, {method: "POST", mode:
"no-cors", credentials: "include", body})` with a `text/plain` body, which the
server parses as JSON like any other. A page on any site could so run turns,
delete threads or delete a user's data, with the cookies of a proxy that
authenticates by cookie (Databricks Apps' `X-Forwarded-User`), or on a local
`tt-agent serve`, which is anonymous (cross-site request forgery). So:

* **Writes from another site's page are refused** (403, nothing run): a
  request of any method but GET, HEAD and OPTIONS whose `Origin` header (which
  browsers send on every cross-origin write) names neither this server (its
  `Host`, or the `X-Forwarded-Host` a proxy passes) nor an origin of
  `cors_origins`. Clients that are not browsers (the `openai` package, curl,
  MLflow) send no `Origin` and are not affected. The check is the one OWASP
  recommends ("Verifying Origin With Standard Headers").
* **Hosts not served are refused** (400) when `allowed_hosts` is set: a page
  on `evil.example.com` whose name the attacker re-points at 127.0.0.1 (DNS
  rebinding) is same-origin with the server by name, so the `Origin` check
  passes it; its requests still say `Host: evil.example.com`. `tt-agent serve`
  bound to a loopback address (its default, 127.0.0.1) sets `allowed_hosts` to
  the loopback names unless the environment sets `AGENT_ALLOWED_HOSTS`
  (`serving.app`); elsewhere (a container on 0.0.0.0 behind a proxy) the host
  is the proxy's business unless set.

Starlette's `TrustedHostMiddleware` makes the host check too, but answers in
plain text; these answers have the route's error body (`serving.errors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from agent.serving.errors import send_error_answer, status_answer_body

#: Methods a page may make a browser send to any site: they only read.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: What `tt-agent serve` bound to a loopback address answers to, unless `AGENT_ALLOWED_HOSTS` says otherwise.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


class BrowserGuard:
    """ASGI middleware: refuse a write whose `Origin` is another site not in `cors_origins` (403), and, with
    `allowed_hosts`, a request whose `Host` is none of them (400); see the module docstring.

    `allowed_hosts` entries are host names without a port (`"chat.example.com"`, `"[::1]"`), `"*.example.com"`
    for its subdomains, or `"*"` for any host (as empty)."""

    def __init__(self, app: Any, *, cors_origins: Sequence[str] = (), allowed_hosts: Sequence[str] = ()) -> None:
        self.app = app
        self.any_origin = "*" in cors_origins
        self.origins = frozenset(origin.lower() for origin in cors_origins)
        self.hosts = () if "*" in allowed_hosts else tuple(host.lower() for host in allowed_hosts)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope.get("headers") or []}
        host = headers.get(b"host", "")
        if self.hosts and not _host_allowed(_without_port(host), self.hosts):
            message = (
                f"This server does not answer to the host {host!r}; set AGENT_ALLOWED_HOSTS (allowed_hosts) to the "
                "names clients use to reach it"
            )
            await send_error_answer(scope, send, 400, status_answer_body(scope.get("path", ""), 400, message))
            return
        origin = headers.get(b"origin")
        if scope["method"] not in SAFE_METHODS and origin is not None and not self._origin_allowed(origin, headers):
            message = (
                f"A request from a page on {origin} is refused: only pages of this server or of an origin in "
                "AGENT_CORS_ORIGINS (cors_origins) may send it; nothing was run"
            )
            await send_error_answer(scope, send, 403, status_answer_body(scope.get("path", ""), 403, message))
            return
        await self.app(scope, receive, send)

    def _origin_allowed(self, origin: str, headers: dict[bytes, str]) -> bool:
        if self.any_origin or origin.lower() in self.origins:
            return True
        own = urlsplit(origin).netloc.lower() if origin != "null" else None  # "null": a sandboxed or file:// page
        served = {headers.get(b"host", "").lower(), headers.get(b"x-forwarded-host", "").split(",")[0].strip().lower()}
        return own is not None and own != "" and own in served


def _without_port(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[: host.index("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def _host_allowed(host: str, allowed: Sequence[str]) -> bool:
    return any(host == entry or (entry.startswith("*.") and host.endswith(entry[1:])) for entry in allowed)
