"""The client side of ``gpueff serve``'s HTTP API: where it is, and one sealed exchange with it.

Three callers, one way to ask: ``seff-gpu`` on a login node (a query, as the user who runs it), ``gpueff
forward`` on a GPU node (a batch of records, as root) and ``gpueff doctor`` (a ping). Each request is sealed
for the service's account (``[service] user``) and each answer must come sealed by it (access/sealed.py):
the client never hands a readable request to, nor trusts an answer from, a process that is not the
service. Where the service's address is on this host, the kernel names the process at the other end before
a byte is sent (access/peer.py): an ordinary user squatting on the port is refused by name.

Stdlib only: ``seff-gpu`` on a login node needs nothing beyond the standard library.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, NamedTuple

from ..errors import GpueffError
from . import munge, peer, sealed

if TYPE_CHECKING:
    from ..config import ServiceConfig


# The API's paths, for both ends (service/api.py serves them).
SEFF_PATH = "/v1/seff"  # a seff-gpu query
RECORDS_PATH = "/v1/records"  # a node's push
PING_PATH = "/v1/ping"  # a sealed round trip, nothing else (doctor)
HEALTH_PATH = "/v1/health"  # GET, not sealed: whether the service runs, for anyone


class Unreachable(GpueffError):
    """No answer from the service: no address configured, munged cannot sign, or the connection failed
    (``not_listening``: nothing listens at the address, e.g. a service still starting)."""

    def __init__(self, message: str, not_listening: bool = False):
        super().__init__(message)
        self.not_listening = not_listening


class Impostor(Unreachable):
    """What answers at the service's address is not the service (another account, or an answer not sealed)."""


class Reply(NamedTuple):
    """An answer: sealed by the service (its status and body are the service's own), or a refusal that
    could not be sealed (before the service knew who asked: a bad credential, munged down, busy), which no
    caller takes as an answer, only as a reason."""

    status: int
    body: bytes
    retry_after_s: float | None = None  # a refusal's Retry-After: when the service wants this client back
    seal: str | None = None  # the raw answer's Gpueff-Seal header (the envelope), before it is opened
    sealed: bool = False  # opened: status and body are what the service sealed

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
            timeout: float = 10.0, expect_uid: int | None = None) -> Reply:
    """One HTTP/1.1 exchange with the service at ``url`` (``http://``, ``https://`` or ``unix:/PATH``), the
    connection closed after it; raises OSError (socket errors, timeouts) or ValueError (not an HTTP reply).

    Written here rather than taken from ``http.client``: importing that module pulls in the e-mail parser and
    ssl, which took longer than the rest of ``seff-gpu``'s start, a command users type and wait on. Both ends
    are ours and the exchange is the plainest HTTP has: one request with a Content-Length, ``Connection:
    close``, and a reply read to its Content-Length (or to the close) from ``http.server``.

    ``expect_uid``: the account that must be at the other end where this host's kernel can tell (the
    service's address is on this host); :class:`Impostor` before anything is sent otherwise."""
    sock, host = _connect(url, timeout)
    try:
        if expect_uid is not None:
            _check_peer(sock, url, expect_uid)
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
    want = int(length) if length is not None and length.isascii() and length.isdigit() else None
    retry = headers.get("retry-after", "")
    retry_after_s = float(retry) if retry.isascii() and retry.isdigit() else None
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
    return Reply(int(status[:3]), body[:want] if want is not None else body, retry_after_s,
                 headers.get(sealed.SEAL_HEADER.lower()))


def service_uid(service: ServiceConfig) -> int:
    """The uid of ``[service] user`` on this host: the only account whose answers a client takes."""
    import pwd

    user = service.user
    if user.isascii() and user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise Unreachable(f"[service] user = {user!r} is not a user on this host: clients take answers only "
                          "from the service's account; set it to the account `gpueff serve` runs as") from None


def service_name(service: ServiceConfig, uid: int) -> str:
    return service.user if not service.user.isdigit() else f"uid {uid}"


def _check_peer(sock: socket.socket, url: str, expect_uid: int) -> None:
    uid = peer.peer_uid(sock)
    if uid is not None and uid != expect_uid:
        from .privacy import user_name

        name = user_name(uid)
        raise Impostor(f"the process at {_where(url)} is not the gpueff service (uid {uid}"
                       f"{f' ({name})' if name else ''}, expected {user_name(expect_uid) or f'uid {expect_uid}'}); "
                       "nothing was sent to it. Tell the site's administrators")


def _where(url: str) -> str:
    if url.startswith("unix:"):
        return url
    from urllib.parse import urlsplit

    return urlsplit(url).netloc.rpartition("@")[2] or url


def post_signed(service: ServiceConfig, path: str, body: bytes, *, timeout_s: float | None = None,
                name: str = "the service") -> Reply:
    """POST ``body`` to the service's ``path``, sealed for the service's account; the service's answer,
    opened and checked (made by that account, for this request), whatever its status, or a refusal the service
    could not seal (``sealed`` False: never an answer). :class:`Unreachable` (saying where and why, in one
    line) when there is no answer; :class:`Impostor` when something else answers there."""
    url = api_url(service)
    if not url:
        raise Unreachable("no [service] api_url (nor api_listen) is configured")
    timeout = service.api_timeout_s if timeout_s is None else timeout_s
    fail = f"cannot reach {name} at {url}"
    svc_uid = service_uid(service)
    try:
        out = sealed.seal(body, svc_uid, service.munge_socket, timeout)
    except munge.MungeError as exc:
        raise Unreachable(f"{fail}: {exc}") from None
    try:
        reply = request(url, "POST", path, out.parts, {"Authorization": f"MUNGE {out.envelope}",
                                                      "Content-Type": sealed.CONTENT_TYPE}, timeout, svc_uid)
    except Impostor:
        raise
    except (OSError, ValueError) as exc:
        raise Unreachable(f"{fail}: {getattr(exc, 'strerror', None) or exc or type(exc).__name__}",
                          isinstance(exc, ConnectionRefusedError | FileNotFoundError)) from None
    if reply.seal is None:
        if reply.status == 200:
            raise Impostor(f"the process at {_where(url)} is not the gpueff service (its answer is not sealed by "
                           f"{service_name(service, svc_uid)}); nothing it said is used")
        return reply  # a refusal made before the service knew who asked: a reason, never an answer
    return _opened(service, reply, out.envelope, svc_uid, timeout, fail, url)


MAX_ANSWER = 1 << 30  # bytes of an opened answer: far above any table, below a client's memory


def _opened(service: ServiceConfig, reply: Reply, envelope: str, svc_uid: int, timeout: float, fail: str,
            url: str) -> Reply:
    """The sealed answer opened: made by the service's account, for the request sealed as ``envelope``."""
    assert reply.seal is not None
    try:
        env = sealed.open_envelope(reply.seal, service.munge_socket, timeout)
        if env.uid != svc_uid:
            from .privacy import user_name

            name = user_name(env.uid)
            raise Impostor(f"the process at {_where(url)} is not the gpueff service (uid {env.uid}"
                           f"{f' ({name})' if name else ''}, expected {service_name(service, svc_uid)}); nothing "
                           "it said is used. Tell the site's administrators")
        if env.head.get("re") != sealed.digest(envelope):
            raise Impostor(f"the answer from {_where(url)} is not the answer to this request (an old answer "
                           "sent again?); nothing it said is used")
        status = env.head.get("status")
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
            raise Impostor(f"the answer from {_where(url)} has no status; nothing it said is used")
        body = sealed.open_parts(env, reply.body, MAX_ANSWER, service.munge_socket, timeout)
    except Impostor:
        raise
    except munge.CredentialRefused as exc:
        raise Impostor(f"the answer from {_where(url)} cannot be opened ({exc}): it is not the service's "
                       "answer to this user; nothing it said is used") from None
    except (munge.MungeError, sealed.SealError) as exc:
        raise Unreachable(f"{fail}: its answer cannot be opened: {exc}") from None
    return Reply(status, body, reply.retry_after_s, reply.seal, sealed=True)
