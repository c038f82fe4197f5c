"""Prometheus ``/metrics`` behind a bearer token: the service's (``[service] metrics_token_file``) and the node
agent's (``[agent] metrics_token_file``). Either endpoint listens on 127.0.0.1 by default, and loopback is no
boundary: every local user reaches it (on a GPU node, every user with a job there). With a token, a scrape
without ``Authorization: Bearer <token>`` gets 401 and no figure; Prometheus sends it with
``authorization: {credentials_file: ...}``.

prometheus_client is imported when a server starts (this package's base layer imports only the standard
library at module level).
"""

from __future__ import annotations

import hmac
import socketserver
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def serve(registry: Any, address: str, port: int, token: str | None,
          key: str = "[service] metrics_token_file") -> tuple[WSGIServer, threading.Thread]:
    """/metrics of ``registry`` on ``address:port`` in a daemon thread. With ``token``, a scrape without
    ``Authorization: Bearer <token>`` gets 401 (naming the config ``key`` that sets it) and no figure; the
    token is compared in constant time."""
    from prometheus_client import make_wsgi_app

    app = make_wsgi_app(registry)
    expected = f"Bearer {token}".encode() if token else None
    refusal = f"a bearer token is required ({key})\n".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                                ("WWW-Authenticate", 'Bearer realm="gpueff"')])
            return [refusal]
        return app(environ, start_response)

    server = make_server(address, port, guarded, _ThreadingWSGIServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="gpueff-metrics", daemon=True)
    thread.start()
    return server, thread
