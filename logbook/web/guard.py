"""ASGI middleware in front of every route: only GET and HEAD pass (405
otherwise, whatever the path), and every answer says what the browser may
load: its own origin only, no inline script and no eval (so a run's string
that slipped into the HTML could still not run).

Styles may be inline and images ``data:`` URLs: BokehJS, which draws the
curves, styles its elements and its toolbar's icons that way. A style cannot
run code; scripts stay limited to the page's own files."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

READ_METHODS = ("GET", "HEAD")
SECURITY_HEADERS = (
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
     b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
PLOT_PAGE_CSP = ("sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; "
                 "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'")
"""The policy of a ``logbook plot --html`` file the page links to: its bokeh is inline, so its
scripts must run; sandboxed (an origin of its own) and offline, they reach neither the
page's JSON nor anything else."""


class ReadOnlyGuard:
    """Refuses every method but GET and HEAD; adds :data:`SECURITY_HEADERS` (a route that sets
    its own content-security-policy, :data:`PLOT_PAGE_CSP`, keeps it)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in READ_METHODS:
            await self._refuse(send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                own = {name.lower() for name, _ in headers}
                message["headers"] = [*headers, *(h for h in SECURITY_HEADERS if h[0] not in own)]
            await send(message)

        await self.app(scope, receive, with_headers)

    @staticmethod
    async def _refuse(send: Send) -> None:
        body = b"this page is read-only: it answers GET and HEAD only\n"
        await send({"type": "http.response.start", "status": 405, "headers": [
            (b"allow", b"GET, HEAD"), (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": body})
