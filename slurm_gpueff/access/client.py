"""The client side of ``gpueff serve``'s HTTP API: where it is, and one signed request to it.

Two callers, one way to ask: ``seff-gpu`` on a login node (a query, as the user who runs it) and
``gpueff forward`` on a GPU node (a batch of records, as root). Each request carries a MUNGE credential
whose payload is the SHA-256 of its body (access/munge.py), so the service learns who sent exactly these
bytes and that nobody sends them again. Like Slurm's own messages, requests are signed, not encrypted;
an ``https://`` address makes them TLS.

Stdlib only: ``seff-gpu`` on a login node needs nothing beyond the standard library.
"""

from __future__ import annotations

import http.client
import socket
from typing import TYPE_CHECKING, NamedTuple

from ..errors import GpueffError
from . import munge

if TYPE_CHECKING:
    from ..config import ServiceConfig


# The API's paths, for both ends (service/api.py serves them).
SEFF_PATH = "/v1/seff"  # a seff-gpu query
RECORDS_PATH = "/v1/records"  # a node's push
HEALTH_PATH = "/v1/health"  # GET: 200 "ok"


class Unreachable(GpueffError):
    """No answer from the service: no address configured, munged cannot sign, or the connection failed."""


class Reply(NamedTuple):
    status: int
    body: bytes

    def reason(self) -> str:
        """The first line of a refusal's body (the service puts its one-line reason there)."""
        lines = self.body.decode("utf-8", "replace").strip().splitlines()
        return lines[0] if lines else f"HTTP {self.status}"


def api_url(service: ServiceConfig) -> str:
    """``[service] api_url``, else derived from ``api_listen`` (a wildcard address -> this host's loopback)."""
    if service.api_url or not service.api_listen:
        return service.api_url
    if service.api_listen.startswith("unix:"):
        return service.api_listen
    host, _, port = service.api_listen.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host and not host.startswith('[') else host}:{port}"


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (``unix:/PATH``): the service's API where everything runs on one host."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    if url.startswith("unix:"):
        return UnixHTTPConnection(url[len("unix:"):], timeout)
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "localhost", parts.port, timeout=timeout)


def post_signed(service: ServiceConfig, path: str, body: bytes, *, timeout_s: float | None = None,
                name: str = "the service") -> Reply:
    """POST ``body`` to the service's ``path`` with a MUNGE credential made for it; the service's reply, whatever
    its status. :class:`Unreachable` (saying where and why, in one line) when there is no reply."""
    url = api_url(service)
    if not url:
        raise Unreachable("no [service] api_url (nor api_listen) is configured")
    timeout = service.api_timeout_s if timeout_s is None else timeout_s
    fail = f"cannot reach {name} at {url}"
    try:
        cred = munge.encode(munge.body_digest(body), service.munge_socket, timeout)
    except munge.MungeError as exc:
        raise Unreachable(f"{fail}: {exc}") from None
    conn = connection(url, timeout)
    try:
        conn.request("POST", path, body, {"Authorization": f"MUNGE {cred}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        return Reply(resp.status, resp.read())
    except (OSError, http.client.HTTPException) as exc:
        raise Unreachable(f"{fail}: {getattr(exc, 'strerror', None) or exc or type(exc).__name__}") from None
    finally:
        conn.close()
