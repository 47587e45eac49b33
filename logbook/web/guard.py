"""ASGI middleware in front of every route: only GET and HEAD pass (405
otherwise, whatever the path), and every answer says what the browser may
load: its own origin only, no inline script (so a run's string that slipped
into the HTML could still not run)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

READ_METHODS = ("GET", "HEAD")
SECURITY_HEADERS = (
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
     b"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class ReadOnlyGuard:
    """Refuses every method but GET and HEAD; adds :data:`SECURITY_HEADERS`."""

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
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)

    @staticmethod
    async def _refuse(send: Send) -> None:
        body = b"this page is read-only: it answers GET and HEAD only\n"
        await send({"type": "http.response.start", "status": 405, "headers": [
            (b"allow", b"GET, HEAD"), (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": body})
