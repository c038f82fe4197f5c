"""The client side of ``gpueff serve``'s HTTP API: where it is, and one signed request to it.

Two callers, one way to ask: ``seff-gpu`` on a login node (a query, as the user who runs it) and
``gpueff forward`` on a GPU node (a batch of records, as root). Each request carries a MUNGE credential
whose payload is the SHA-256 of its body (access/munge.py), so the service learns who sent exactly these
bytes and that nobody sends them again. Like Slurm's own messages, requests are signed, not encrypted;
an ``https://`` address makes them TLS.

Stdlib only: ``seff-gpu`` on a login node needs nothing beyond the standard library.
"""

from __future__ import annotations

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
    retry_after_s: float | None = None  # a refusal's Retry-After: when the service wants this client back

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


MAX_HEAD = 64 << 10  # a reply's status line and headers; the body is as long as its Content-Length


def request(url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            timeout: float = 10.0) -> Reply:
    """One HTTP/1.1 exchange with the service at ``url`` (``http://``, ``https://`` or ``unix:/PATH``), the
    connection closed after it; raises OSError (socket errors, timeouts) or ValueError (not an HTTP reply).

    Written here rather than taken from ``http.client``: importing that module pulls in the e-mail parser and
    ssl, which took longer than the rest of ``seff-gpu``'s start, a command users type and wait on. Both ends
    are ours and the exchange is the plainest HTTP has: one request with a Content-Length, ``Connection:
    close``, and a reply read to its Content-Length (or to the close) from ``http.server``."""
    sock, host = _connect(url, timeout)
    try:
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close",
                f"Content-Length: {len(body)}", *[f"{k}: {v}" for k, v in (headers or {}).items()]]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        return _read_reply(sock)
    finally:
        sock.close()


def _connect(url: str, timeout: float) -> tuple[socket.socket, str]:
    """The connected socket and the Host header that names the address (host and port, as the URL gives them)."""
    if url.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(url[len("unix:"):])
        except OSError:
            sock.close()
            raise
        return sock, "localhost"
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http://, https:// or unix: address: {url!r}")
    tls = parts.scheme == "https"
    host = parts.netloc.rpartition("@")[2]  # never user:password@, where a URL carries one
    sock = socket.create_connection((parts.hostname, parts.port or (443 if tls else 80)), timeout)
    if not tls:
        return sock, host
    import ssl

    try:
        return ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname), host
    except OSError:
        sock.close()
        raise


def _read_reply(sock: socket.socket) -> Reply:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise ValueError("the reply's headers are too long")
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("the connection closed before a reply" if not data else "the reply was cut short")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, _, status = lines[0].partition(" ")
    if not version.startswith("HTTP/") or not status[:3].isdigit():
        raise ValueError(f"not an HTTP reply: {lines[0][:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = headers.get("content-length")
    want = int(length) if length is not None and length.isdigit() else None
    retry = headers.get("retry-after", "")
    retry_after_s = float(retry) if retry.isdigit() else None
    parts = [rest]
    got = len(rest)
    while want is None or got < want:
        chunk = sock.recv(1 << 20)
        if not chunk:
            if want is not None:
                raise ValueError(f"the reply was cut short ({got} of {want} bytes)")
            break
        parts.append(chunk)
        got += len(chunk)
    body = b"".join(parts)
    return Reply(int(status[:3]), body[:want] if want is not None else body, retry_after_s)


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
    try:
        return request(url, "POST", path, body, {"Authorization": f"MUNGE {cred}",
                                                 "Content-Type": "application/json"}, timeout)
    except (OSError, ValueError) as exc:
        raise Unreachable(f"{fail}: {getattr(exc, 'strerror', None) or exc or type(exc).__name__}") from None
