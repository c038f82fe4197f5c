"""``gpueff serve``'s HTTP API: how users read their jobs from a database private to the service, and how
GPU nodes hand it their records.

``POST /v1/seff``: seff-gpu's query (seff.query.SeffQuery as JSON); the answer is the
seff.query.Answer as JSON, the same bytes seff-gpu's direct path prints. ``POST /v1/records``: a
node's ``gpueff forward`` pushing spool records (service/intake.py), taken from root and ``[service]
push_users`` only. ``POST /v1/ping``: a sealed round trip and nothing else (doctor). ``GET /v1/health``:
not sealed, for anyone: JSON, ``{"status": "ok", "tasks": [...], ...}`` with 200, or ``"status": "damaged"``
and the one-line ``detail`` with 503 while the database is damaged; ``tasks`` is each scheduled task's last
run and lateness (service/taskhealth.py: no job, user or database named). Anything else: 404.

Every POST is sealed (access/sealed.py): the request for this service's account, its envelope in the
``Authorization: MUNGE`` header; the answer for the uid that asked, naming the request it answers, its
envelope in the ``Gpueff-Seal`` header. Who asks is what munged vouches for, never what the request says,
and a relayed request gives the relayer nothing it can open. Then the privacy rules
(slurm_gpueff.access.privacy) decide what the uid may see, as on the direct path. Refusals made before the
service knows who asks (no or a refused credential: 401; a body beyond any sealed request of its kind:
413; munged not answering: 503; busy: 503) cannot be sealed and are plain one-line texts, which a client
takes as a reason, never as an answer. After that every answer is sealed: a bad query 400, a push of
someone who may not push 401, a payload too large 413, the database down or damaged 503, each with a
one-line reason, and nothing written. One log line per request: uid, what kind of query, status, time;
never a job's contents. A refused request's line is written at most once a minute per uid and reason,
with a count of the others (service/refusals.py).

Listens on ``[service] api_listen``: ``HOST:PORT`` (TCP) or ``unix:/PATH`` (a socket file made 0666 so
every local user can connect; the uid still comes from MUNGE). stdlib ``http.server``, a thread per
request; each request opens and closes its own database reads.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import logging
import math
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from sqlalchemy.engine import Engine

from .. import __version__
from ..access import peer, sealed
from ..access.client import HEALTH_PATH, PING_PATH, RECORDS_PATH, SEFF_PATH
from ..access.munge import CredentialRefused, MungeError
from ..access.privacy import Viewer, user_name, viewer
from ..config import Config
from ..errors import GpueffError
from ..seff.answer import answer
from ..seff.lookup import keep_engines
from ..seff.query import EXIT_NO_GPUS, EXIT_OK, EXIT_RUNNING, MAX_LIMIT, TABLE_LIMIT, SeffQuery
from .intake import Intake, IntakeError, push_uids
from .refusals import Key, Pace

log = logging.getLogger("gpueff.api")

MAX_BODY = 16 * 1024  # a query is a few hundred bytes
REFUSALS = Pace()  # the log lines of refused requests (service/refusals.py)
KINDS = {SEFF_PATH: "seff", RECORDS_PATH: "push", PING_PATH: "ping"}  # the POST paths, as the log names them
COORDINATORS_TTL_S = 300.0  # sacctmgr is asked at most this often
_TEXT = ("jobid", "user", "account", "start", "end", "cluster", "state")
_FLAGS = ("json", "html")


ANSWERED = (EXIT_OK, EXIT_RUNNING, EXIT_NO_GPUS)  # seff-gpu's statuses of an answer; the others are refusals


class Handled(NamedTuple):
    """A request's outcome: its HTTP status, answer and log line, and whether it was refused (its log line is
    paced: service/refusals.py)."""

    status: int
    data: bytes
    what: str
    refused: bool = False


class HttpError(Exception):
    def __init__(self, status: int, reason: str, retry_after_s: int | None = None):
        super().__init__(reason)
        self.status = status
        self.retry_after_s = retry_after_s


MAX_DEPTH = 2  # a query is one object of plain values; a list in it (depth 2) is refused by its key's check


def parse_query(body: bytes) -> SeffQuery:
    """The SeffQuery in a request body; HttpError 400 if it is not one. Every value is checked before use: its
    type, its size, and text a database can take (no NUL, no unpaired surrogate: SQLite's driver cannot encode
    one, PostgreSQL refuses the other); nesting is bounded before the JSON parser recurses into it (20,000
    ``[`` made it raise RecursionError). The times are ISO text; one with an offset (``+14:00``) is turned into
    UTC by the answer (seff/answer.py), one that is not a time gets seff-gpu's usage answer there."""
    if nests_deeper(body, MAX_DEPTH):
        raise HttpError(400, f"the body nests deeper than {MAX_DEPTH} levels: a query is one JSON object of "
                             "strings, numbers, true/false and null")
    try:
        d = json.loads(body)
    except ValueError:  # also text that is not UTF-8, and numbers of 4,300 digits and more
        raise HttpError(400, "the body is not JSON") from None
    if not isinstance(d, dict) or not set(d) <= {*_TEXT, *_FLAGS, "limit"}:
        raise HttpError(400, f"the body must be an object with keys among {', '.join((*_TEXT, *_FLAGS, 'limit'))}")
    limit = d.get("limit", TABLE_LIMIT)
    if not (isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit <= MAX_LIMIT):
        raise HttpError(400, f"limit must be a whole number from 0 to {MAX_LIMIT}")
    for key in _TEXT:
        if not (d.get(key) is None or (isinstance(d[key], str) and len(d[key]) <= 256)):
            raise HttpError(400, f"{key} must be a string or null")
        if isinstance(d.get(key), str) and not storable(d[key]):
            raise HttpError(400, f"{key} holds a NUL character or an unpaired surrogate: no text a query can use")
    for key in _FLAGS:
        if not isinstance(d.get(key, False), bool):
            raise HttpError(400, f"{key} must be true or false")
    if d.get("jobid") is None and d.get("user") is None and d.get("account") is None:
        raise HttpError(400, "give a jobid, or a user or account for a table")
    return SeffQuery(**d)


def nests_deeper(body: bytes, limit: int) -> bool:
    """Whether the JSON text ``body`` opens more than ``limit`` arrays or objects inside each other (brackets in
    strings do not count). One pass over the bytes, before any parser: bounded whatever the body holds."""
    depth, in_string, escaped = 0, False, False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def storable(text: str) -> bool:
    """Whether a database takes ``text`` as a parameter: no NUL and no unpaired surrogate (JSON's ``\\ud800``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


# The pushes stored at once and how long one waits for a slot are [service] push_slots and push_wait_s.
# The gap between two stored pushes assumed until one is measured (pace_s and alone_s start here, then follow
# the pushes as moving averages): about the time a small service host takes to store one node's push, and
# rather too short than too long: a node given an early turn waits in the queue (up to push_wait_s), where a
# node given a late turn leaves the service idle.
PACE_START_S = 0.05
# The longest summarizing pauses, between two of its batches, for waiting pushes and the turns given: longer
# than a push waits in the queue (push_wait_s, a few seconds by default), so that one wave of nodes gets
# through, and short enough that the analysis of the stored jobs still moves on by a batch between waves
# (a herd's drain lasts minutes: summaries held back by the whole of it would come all at its end).
MAKE_WAY_S = 10.0


class Api:
    """The request logic, apart from HTTP: credential -> viewer -> answer."""

    def __init__(self, config: Config, engine: Engine | None = None,
                 damage: Callable[[], str | None] = lambda: None,
                 tasks: Callable[[], dict[str, Any]] = dict):
        self.config = config
        self.damage = damage  # the service's integrity check: what it found wrong with the database, or None
        self.tasks = tasks  # the scheduled tasks' report for /v1/health (service/taskhealth.py), or {}
        self._coordinators: tuple[float, dict[str, list[str]]] = (-COORDINATORS_TTL_S, {})
        self._lock = threading.Lock()
        self.pushers = push_uids(config.service.push_users)
        self.intake = Intake(engine, config.paths.spool_dir) if engine is not None else None
        self.push_slots = threading.BoundedSemaphore(config.service.push_slots)
        # at most half the nodes' wait (api_timeout_s): the rest is for the push's credential and its store
        self.push_wait_s = min(config.service.push_wait_s, config.service.api_timeout_s / 2)
        self.waiting = 0  # pushes waiting for a slot now
        self.answering = 0  # users' questions (seff-gpu) being answered now
        self._counting = threading.Lock()
        self.pace_s = PACE_START_S  # the gap between two pushes stored while others wait, a moving average
        self.alone_s = PACE_START_S  # how long a push takes when none waits (nor waited for it), a moving average
        self._last_done: float | None = None  # when the last push was stored, if others were waiting then
        self.turns_until = 0.0  # monotonic time of the last turn given to a node told busy (nodes due until then)

    @contextlib.contextmanager
    def push_slot(self) -> Iterator[None]:
        """One of the ``[service] push_slots`` pushes taken at once, or HttpError 503 after waiting
        ``push_wait_s`` (``[service] push_wait_s``, at most half of ``api_timeout_s``): after an
        outage every node pushes at once, and a thread per push, all verifying credentials and writing
        together, made each push take longer than the nodes wait for an answer; they then sent it all again.
        Bounded, the service stores as fast as the database lets it, the waiting pushes first come, first
        served. "Busy" is not a failure: its Retry-After (the node's turn: :meth:`turn`) brings the node back
        when a slot should be free, where its failure backoff (doubling, up to minutes) left the service idle
        while a backlog waited on the nodes."""
        with self._counting:
            self.waiting += 1
        try:
            got = self.push_slots.acquire(timeout=self.push_wait_s)
        finally:
            with self._counting:
                self.waiting -= 1
        if not got:
            raise HttpError(503, "busy: other nodes' pushes are being stored; the forwarder retries",
                            retry_after_s=self.turn())
        t0, alone = time.monotonic(), not self.waiting
        try:
            yield
        finally:
            self.push_slots.release()
            with self._counting:
                now = time.monotonic()
                if self._last_done is not None:  # the service was saturated since the last one: its pace
                    self.pace_s += 0.1 * (now - self._last_done - self.pace_s)
                elif alone and not self.waiting:
                    self.alone_s += 0.1 * (now - t0 - self.alone_s)
                self._last_done = now if self.waiting else None

    def turn(self) -> int:
        """Seconds until a node told busy should come back: its own turn, after the pushes waiting now and the
        turns given before it, one push apart. Every node coming back one forward interval after an outage
        brought the whole herd back each interval; turns spaced by how long a push held its slot in the
        herd's worst moment left the service idle for minutes after it. A push apart is the shorter of the
        service's pace while pushes waited and a push's time when none did (the pace once the herd has
        passed, which the turns are for): a node early by a turn waits in the queue (up to ``push_wait_s``),
        where one late by a turn leaves the service idle."""
        with self._counting:
            now = time.monotonic()
            apart = min(self.pace_s, self.alone_s)
            self.turns_until = max(self.turns_until, now + self.waiting * apart) + apart
            wait = self.turns_until - now
        return max(1, math.ceil(wait - 1e-6))  # whole seconds (Retry-After), not one more for a rounding error

    def make_way(self, max_s: float = MAKE_WAY_S) -> None:
        """Wait, at most ``max_s``, while pushes wait for a slot or nodes told busy are still due (a turn given
        has not come yet), or a user's question is being answered: the background work in this process calls
        this between its batches (summarizing the stored jobs, after an outage most of its CPU; enrich), before
        each card and before an alert pass, so that the nodes' backlog is taken first and its analysis follows
        once the herd has passed, and a user waiting at a terminal does not share the interpreter with the
        background work. At a steady load nobody is told busy, and summarizing goes on as the records come."""
        deadline = time.monotonic() + max_s
        while (now := time.monotonic()) < deadline and (self.waiting or self.answering or now < self.turns_until):
            time.sleep(0.05)

    @contextlib.contextmanager
    def question(self) -> Iterator[None]:
        """A user's question being answered (:meth:`make_way` waits for it)."""
        with self._counting:
            self.answering += 1
        try:
            yield
        finally:
            with self._counting:
                self.answering -= 1

    def max_body(self, path: str) -> int:
        return int(self.config.service.push_max_mb * 1024 * 1024) if path == RECORDS_PATH else MAX_BODY

    def coordinators(self) -> dict[str, list[str]]:
        """Slurm's account coordinators, cached a few minutes; a failure is logged and gives none."""
        from ..errors import SlurmCommandError
        from ..slurm.commands import RESOLVE_TIMEOUT_S, account_coordinators

        with self._lock:
            at, known = self._coordinators
            if time.monotonic() - at < COORDINATORS_TTL_S:
                return known
            try:
                known = account_coordinators(self.config, min(RESOLVE_TIMEOUT_S, self.config.sacct.timeout_s))
            except SlurmCommandError as exc:
                log.warning("account coordinators unknown (none assumed): %s", exc)
                known = {}
            self._coordinators = (time.monotonic(), known)
            return known

    def viewer(self, uid: int) -> Viewer:
        return viewer(self.config, uid, user_name(uid), os.getuid(), self.coordinators)

    def sender(self, authorization: str | None, path: str) -> sealed.Envelope:
        """Who munged says sealed this request, asked before its body is read (a push of someone who may not
        push is refused without holding its body); :meth:`open_body` then opens the body it names."""
        scheme, _, credential = (authorization or "").partition(" ")
        if scheme != "MUNGE" or not credential.strip():
            raise HttpError(401, "missing credential: send Authorization: MUNGE <sealed envelope> (seff-gpu does)")
        socket_, timeout = self.config.service.munge_socket, self.config.service.api_timeout_s
        try:
            env = sealed.open_envelope(credential, socket_, timeout)
        except CredentialRefused as exc:
            if "unauthorized" in str(exc):  # sealed for another uid: the sender's [service] user is not ours
                me = user_name(os.getuid()) or f"uid {os.getuid()}"
                raise HttpError(401, f"{exc}: the request was sealed for another account than this service's "
                                     f"({me}); set [service] user = \"{me}\" on the sending host") from None
            raise HttpError(401, str(exc)) from None
        except sealed.SealError as exc:
            raise HttpError(401, f"{exc} (a client older or newer than this service?)") from None
        except MungeError as exc:
            raise HttpError(503, f"the service cannot check credentials: {exc}") from None
        damage = self.damage()
        if damage is not None:  # a push is kept on its node, a question asked again once it is restored
            raise HttpError(503, f"{damage}: the service reads and takes nothing until it is restored from a backup")
        if path == RECORDS_PATH:
            if self.intake is None:
                raise HttpError(404, "this service takes no records")
            if env.uid not in self.pushers:
                raise HttpError(401, f"uid {env.uid} may not push records: only root and [service] push_users may")
        return env

    def open_body(self, env: sealed.Envelope, body: bytes, limit: int) -> bytes:
        """The request's payload: the envelope's and the body's parts, at most ``limit`` bytes."""
        try:
            return sealed.open_parts(env, body, limit, self.config.service.munge_socket,
                                     self.config.service.api_timeout_s)
        except sealed.TooLarge:
            raise HttpError(413, f"the request must be at most {limit} bytes") from None
        except (sealed.SealError, CredentialRefused) as exc:
            raise HttpError(401, str(exc)) from None
        except MungeError as exc:
            raise HttpError(503, f"the service cannot check credentials: {exc}") from None

    def seal(self, env: sealed.Envelope, envelope: str, status: int, data: bytes) -> sealed.Sealed:
        """``data`` sealed for the uid that asked, naming the request (its envelope) and the status."""
        return sealed.seal(data, env.uid, self.config.service.munge_socket, self.config.service.api_timeout_s,
                           {"re": sealed.digest(envelope), "status": status})

    def push(self, uid: int, body: bytes) -> Handled:
        """One ``POST /v1/records``; HttpError on refusal."""
        assert self.intake is not None  # sender() refused the push otherwise
        try:
            reply, what = self.intake.push(uid, body)
        except IntakeError as exc:
            raise HttpError(exc.status, str(exc)) from None
        return Handled(200, json.dumps(reply).encode(), what)

    def seff(self, uid: int, body: bytes) -> Handled:
        """One ``POST /v1/seff``; HttpError on a bad query. An answer that is no card (a bad or unknown id,
        another user's job, an error) is a refusal too, for the log's pace."""
        query = parse_query(body)
        result = answer(query, self.config, self.viewer(uid))
        return Handled(200, json.dumps(result.to_json()).encode(), f"uid {uid} {query.kind()} exit {result.exit_code}",
                       refused=result.exit_code not in ANSWERED)

    def ping(self, uid: int, body: bytes) -> Handled:
        """One ``POST /v1/ping``: who the service is, who asked, and
        its scheduled tasks' report (as on /v1/health, but sealed: doctor trusts no other)."""
        return Handled(200, json.dumps({"service": "gpueff", "version": __version__, "uid": os.getuid(),
                                        "asked_by": uid, **self.tasks()}).encode(), f"uid {uid} ping")


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "gpueff"
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stops sending mid-request does not hold its thread for ever
    server: ApiServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        t0 = time.monotonic()
        try:
            if self.path == HEALTH_PATH:
                api = self.server.api
                damage = api.damage()
                health = {"status": "damaged" if damage else "ok", **({"detail": damage} if damage else {}),
                          **api.tasks()}
                self._send(503 if damage else 200, json.dumps(health).encode() + b"\n", "application/json",
                           "health", t0)
            else:
                self._send(404, b"not found\n", "text/plain", "GET ?", t0, key=(None, "GET ?"))
        except GONE:
            self._gone("GET", t0)

    def do_POST(self) -> None:  # noqa: N802
        t0 = time.monotonic()
        what = KINDS.get(self.path, "POST ?")
        api = self.server.api
        unread = 0  # body bytes to discard on a refusal, so the client reads the answer, not a broken pipe
        env: sealed.Envelope | None = None  # once opened, every answer is sealed for its sender
        envelope = ""
        try:
            if self.path not in KINDS:
                raise HttpError(404, "not found")
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise HttpError(411, "Content-Length required") from None
            limit = api.max_body(self.path)
            wire = sealed.wire_limit(limit)
            unread = min(max(length, 0), 2 * wire)
            if length < 0 or length > wire:
                raise HttpError(413, f"the request must be at most {limit} bytes")
            with api.push_slot() if self.path == RECORDS_PATH else contextlib.nullcontext():
                authorization = self.headers.get("Authorization")
                env = api.sender(authorization, self.path)
                envelope = (authorization or "").partition(" ")[2].strip()
                body, unread = self.rfile.read(length), 0
                if len(body) < length:
                    raise HttpError(400, "the body ended early")
                payload = api.open_body(env, body, limit)
                handle = {SEFF_PATH: api.seff, RECORDS_PATH: api.push, PING_PATH: api.ping}[self.path]
                with contextlib.nullcontext() if self.path == RECORDS_PATH else api.question():
                    done = handle(env.uid, payload)  # a question counted once its sender is known
            self._answer(env, envelope, done.status, done.data, done.what, t0, refused=done.refused)
        except HttpError as exc:
            self._discard(unread)
            self.close_connection = True
            self._answer(env, envelope, exc.status, f"{exc}\n".encode(), f"{what}: {exc}", t0, exc.retry_after_s,
                         refused=True)
        except GONE:  # the client gave up waiting: nobody to answer
            self._gone(f"POST {what}", t0)
        except Exception:  # a bug: the caller gets one line, the log the traceback (no job contents in it)
            log.exception("api: request failed")
            self._answer(env, envelope, 500, b"internal error (see the service log)\n", what, t0)

    def _answer(self, env: sealed.Envelope | None, envelope: str, status: int, data: bytes, what: str, t0: float,
                retry_after_s: int | None = None, refused: bool = False) -> None:
        """The answer, sealed for its sender once the service knows who that is; before, a plain refusal.
        ``refused``: its log line is paced (service/refusals.py), per the uid munged named (None before)."""
        key = (env.uid if env else None, what) if refused else None
        if env is None:
            self._send(status, data, "text/plain", what, t0, retry_after_s, key=key)
            return
        try:
            out = self.server.api.seal(env, envelope, status, data)
        except MungeError as exc:
            what = f"{what}: cannot seal the answer: {exc}"
            self._send(503, f"the service cannot seal its answer: {exc}\n".encode(), "text/plain", what, t0,
                       key=(env.uid, what))
            return
        self._send(status, out.parts, sealed.CONTENT_TYPE, what, t0, retry_after_s, out.envelope, key)

    def _gone(self, method: str, t0: float) -> None:
        self.close_connection = True
        log.info("api %s: the client went away before its answer (%d ms)", method, (time.monotonic() - t0) * 1000)

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 20))
            if not chunk:
                return
            length -= len(chunk)

    def _send(self, status: int, data: bytes, ctype: str, what: str, t0: float,
              retry_after_s: int | None = None, seal: str | None = None, key: Key | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if retry_after_s is not None:
            self.send_header("Retry-After", str(retry_after_s))
        if seal is not None:
            self.send_header(sealed.SEAL_HEADER, seal)
        self.end_headers()
        if data:  # an answer all in its envelope has no body; a write of none to a client gone fails
            self.wfile.write(data)
        line = f"api {self.command} {what} -> {status} in {(time.monotonic() - t0) * 1000:.0f} ms"
        for paced in REFUSALS.lines(key, line):  # a refusal at most once a minute, counted
            log.info("%s", paced)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Each request is logged once, by :meth:`_send`."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        """http.server's own lines (its refusals of malformed requests: no such method, a request line too
        long) go to the service log, paced as the API's refusals are (anyone may send them, no credential
        needed)."""
        text = format % args
        for line in REFUSALS.lines((None, text), f"api: {text}"):
            log.info("%s", line)


GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)  # the client is gone


class ApiServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: after an outage thousands of nodes connect at once (at
    # socketserver's 5 the kernel refused most of them: "connection reset", a failure to back off from)
    api: Api

    def handle_error(self, request: Any, client_address: Any) -> None:
        """What escaped a request's handling (http.server's own reading of the request line and headers, an
        answer written to a client that has gone, the final flush): one log line for a client gone, the
        traceback in the log for anything else, never socketserver's traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, GONE):
            log.info("api: the client went away before its answer (%s)", type(exc).__name__)
        else:
            log.exception("api: request failed")


class UnixApiServer(ApiServer):
    """The API on a Unix socket: everything on one host."""

    address_family = socket.AF_UNIX

    def server_bind(self) -> None:
        path = str(self.server_address)
        _clear_stale(path)
        old = os.umask(0o111)  # 0666: every local user may connect; who they are comes from MUNGE
        try:
            self.socket.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o666)
        self.server_name, self.server_port = "localhost", 0

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, _addr = self.socket.accept()
        return conn, ("unix", 0)


def _clear_stale(path: str) -> None:
    """Remove a socket file left by a service that is gone; refuse a live one (naming who holds it) or another
    kind of file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        holder = peer.unix_holder(probe)
    except OSError:
        os.unlink(path)  # nobody listens: stale
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"{path}: another process already listens there"
                                    + (f" ({holder.describe()})" if holder else ""))


def start(config: Config, engine: Engine | None = None,
          damage: Callable[[], str | None] = lambda: None,
          tasks: Callable[[], dict[str, Any]] = dict) -> ApiServer:
    """Listen on ``[service] api_listen`` and serve in a daemon thread; OSError if it cannot listen. With
    ``engine``, it also takes the nodes' pushed records into that database. While ``damage()`` says what
    is wrong with the database, every request is answered 503 with that line (the health check with its
    report too). ``tasks()``: what the health check says of the scheduled tasks."""
    listen = config.service.api_listen
    check_account(config)
    server: ApiServer
    if listen.startswith("unix:"):
        server = UnixApiServer(listen[len("unix:"):], _Handler)  # type: ignore[arg-type]
    else:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        cls = type("ApiServer6", (ApiServer,), {"address_family": socket.AF_INET6}) if ":" in host else ApiServer
        try:
            server = cls((host, int(port)), _Handler)
        except OSError as exc:
            holder = peer.port_holder(int(port)) if exc.errno == errno.EADDRINUSE else None
            if holder is None:
                raise
            raise OSError(exc.errno, f"the port is held by {holder.describe()}") from None
    server.api = Api(config, engine, damage, tasks)
    keep_engines()  # its answers reuse one engine's connections
    threading.Thread(target=server.serve_forever, name="gpueff-api", daemon=True).start()
    log.info("seff-gpu API on %s", listen)
    return server


def check_account(config: Config) -> None:
    """The service answers as ``[service] user`` or not at all: its clients take no answer sealed by another
    account, so a service under the wrong account would look like an impostor to every user."""
    from ..access.client import Unreachable, service_uid

    try:
        want = service_uid(config.service)
    except Unreachable as exc:
        raise GpueffError(str(exc)) from None
    me = os.getuid()
    if me != want:
        raise GpueffError(f"gpueff serve runs as {user_name(me) or f'uid {me}'} but [service] user = "
                          f"{config.service.user!r}: clients take answers only from that account; run the service "
                          "as it, or set [service] user (the same on every host)")


def stop(server: ApiServer) -> None:
    """Stop accepting, let running requests end (they are short), close and remove the socket file."""
    server.shutdown()
    server.server_close()
    if isinstance(server, UnixApiServer):
        with contextlib.suppress(OSError):
            os.unlink(str(server.server_address))
