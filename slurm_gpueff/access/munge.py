"""MUNGE credentials through the ``munge`` and ``unmunge`` commands: how ``gpueff serve`` and its clients
(``seff-gpu``, ``gpueff forward``, doctor) prove to each other who they are (access/sealed.py builds on this).

Every Slurm cluster runs ``munged`` on every host with one shared key, so a credential made on a login node
decodes on the service host, and only munged (running as its own user, reading the caller's uid from the
socket) can put a uid in it: nobody can claim to be another. munged encrypts the payload with the site's
key, decodes a credential restricted to a uid (``--restrict-uid``) only for that uid, and refuses one
decoded twice ("replayed") or past its time-to-live ("expired").

Through libmunge (MUNGE's own client library, ``libmunge.so.2``, installed with munge on every host) when it
loads, else through the ``munge`` and ``unmunge`` commands, which are its clients: the same munged, the same
credentials and errors. In process it costs a round trip to munged; a command costs a fork and an exec as
well, twice for each request and twice for each answer, which at a site's rate (every node's pushes, every
``seff-gpu``) was most of the CPU a push took on the node and much of it on the service host.

Stdlib only (ctypes), every call bounded in time (a command by ``timeout_s``, the library by its own socket
timeouts, a few seconds); a failure is a :class:`MungeError` saying why in one line.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
from typing import NamedTuple

from ..errors import GpueffError

TIMEOUT_S = 5.0


# unmunge's exit status for a credential munged decoded and refused (munge_err_t in munge.h); others
# (munged down, bad socket) come with munge's own message on stderr.
REFUSED = {8: "not a valid credential", 11: "not a valid credential (wrong key?)", 14: "invalid credential",
           15: "expired credential", 16: "rewound credential (clocks differ?)",
           17: "replayed credential (each credential is good for one request)",
           18: "unauthorized credential (sealed for another user)"}
MAX_PAYLOAD = 512 * 1024  # bytes one credential carries: munged refuses requests beyond about 1 MiB, and a
# credential is the payload in base64 (4/3) plus its header


class MungeError(GpueffError):
    """munge/unmunge is missing, munged does not answer, or the credential is not valid."""


class CredentialRefused(MungeError):
    """munged decoded the credential and refused it (invalid, expired, rewound, replayed, another key)."""


class Decoded(NamedTuple):
    """What munged vouches for: the uid and gid of the process that made the credential, and its payload."""

    uid: int
    gid: int
    payload: bytes


def _command(name: str, socket: str) -> list[str]:
    exe = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/usr/local/bin")
    if not exe:
        raise MungeError(f"{name} not found: install MUNGE (the munge package) on this host")
    return [exe] + (["--socket", socket] if socket else [])


def _reason(name: str, stderr: str, rc: int) -> str:
    """munge's own one-line reason, e.g. ``Failed to access "/run/munge/munge.socket.2": No such file or
    directory (Did you start munged?)``, without its ``munge: Error:`` prefix."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    text = lines[0] if lines else f"exit status {rc}"
    for prefix in (f"{name}: Error:", f"{name}:"):
        if text.startswith(prefix):
            return text[len(prefix):].strip()
    return text


# munge.h: the options of a context this module sets
_OPT_SOCKET = 8
_OPT_UID_RESTRICTION = 9


class Library:
    """libmunge's calls as this module makes them: a context for each call (a context is not thread-safe;
    the calls are), the socket and uid restriction set on it, the error's text from the context (munge's
    own words, as its commands print them). ctypes releases the GIL for each call: other threads run while
    munged answers."""

    def __init__(self, lib: ctypes.CDLL, libc: ctypes.CDLL):
        self.lib, self.libc = lib, libc
        lib.munge_ctx_create.restype = ctypes.c_void_p
        lib.munge_ctx_create.argtypes = []
        lib.munge_ctx_destroy.restype = None
        lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.munge_ctx_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        lib.munge_strerror.restype = ctypes.c_char_p
        lib.munge_strerror.argtypes = [ctypes.c_int]
        lib.munge_ctx_set.restype = ctypes.c_int  # variadic: its arguments are typed at each call
        lib.munge_encode.restype = ctypes.c_int
        lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        lib.munge_decode.restype = ctypes.c_int
        lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint),
                                     ctypes.POINTER(ctypes.c_uint)]
        libc.free.restype = None
        libc.free.argtypes = [ctypes.c_void_p]

    def _context(self, socket: str, for_uid: int | None) -> int:
        ctx = self.lib.munge_ctx_create()
        if not ctx:
            raise MungeError("libmunge cannot make a context (out of memory)")
        try:
            if socket:
                self._set(ctx, ctypes.c_int(_OPT_SOCKET), ctypes.c_char_p(socket.encode()))
            if for_uid is not None:
                self._set(ctx, ctypes.c_int(_OPT_UID_RESTRICTION), ctypes.c_uint(for_uid))
        except MungeError:
            self.lib.munge_ctx_destroy(ctx)
            raise
        return int(ctx)

    def _set(self, ctx: int, opt: ctypes.c_int, value: ctypes.c_char_p | ctypes.c_uint) -> None:
        rc = self.lib.munge_ctx_set(ctypes.c_void_p(ctx), opt, value)
        if rc:
            raise MungeError(f"libmunge refuses an option: {self._why(ctx, rc)}")

    def _why(self, ctx: int, rc: int) -> str:
        text = self.lib.munge_ctx_strerror(ctx) or self.lib.munge_strerror(rc) or b""
        return text.decode("utf-8", "replace") or f"error {rc}"

    def encode(self, payload: bytes, socket: str, for_uid: int | None) -> str:
        ctx = self._context(socket, for_uid)
        cred = ctypes.c_void_p()
        try:
            rc = self.lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
            if rc:
                raise MungeError(f"munge cannot make a credential: {self._why(ctx, rc)}")
            return ctypes.string_at(cred.value).decode("ascii") if cred.value else ""
        finally:
            if cred.value:
                self.libc.free(cred)
            self.lib.munge_ctx_destroy(ctx)

    def decode_at(self, credential: str, socket: str) -> tuple[int, str, Decoded | None]:
        """(munge_err_t, munge's reason, what was decoded when it is 0)."""
        ctx = self._context(socket, None)
        buf, size, uid, gid = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint(), ctypes.c_uint()
        try:
            rc = self.lib.munge_decode(credential.encode("ascii"), ctx, ctypes.byref(buf), ctypes.byref(size),
                                       ctypes.byref(uid), ctypes.byref(gid))
            payload = ctypes.string_at(buf.value, size.value) if buf.value and size.value > 0 else b""
            if rc:
                return rc, self._why(ctx, rc), None
            return 0, "", Decoded(uid.value, gid.value, payload)
        finally:
            if buf.value:
                self.libc.free(buf)
            self.lib.munge_ctx_destroy(ctx)


@functools.cache
def library() -> Library | None:
    """libmunge, once per process; None where it does not load (the commands are used then)."""
    try:
        return Library(ctypes.CDLL("libmunge.so.2"), ctypes.CDLL(None))
    except (OSError, AttributeError):
        return None


def encode(payload: bytes, socket: str = "", timeout_s: float = TIMEOUT_S, *, for_uid: int | None = None) -> str:
    """A credential for ``payload`` (at most :data:`MAX_PAYLOAD` bytes) from the local munged, naming the
    calling process's uid; with ``for_uid``, only that uid can decode it (and read the payload)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a credential carries at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    lib = library()
    if lib is not None:
        cred = lib.encode(payload, socket, for_uid)
        if not cred.startswith("MUNGE:"):
            raise MungeError("munge cannot make a credential: libmunge gave none")
        return cred
    restrict = ["--restrict-uid", str(for_uid)] if for_uid is not None else []
    try:
        p = subprocess.run([*_command("munge", socket), *restrict], input=payload, capture_output=True,
                           timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise MungeError(f"munge did not answer within {timeout_s:g} s (is munged running?)") from None
    except OSError as exc:
        raise MungeError(f"cannot run munge: {exc.strerror or exc}") from None
    cred = p.stdout.decode("ascii", "replace").strip()
    if p.returncode != 0 or not cred.startswith("MUNGE:"):
        why = _reason("munge", p.stderr.decode("utf-8", "replace"), p.returncode)
        raise MungeError(f"munge cannot make a credential: {why}")
    return cred


def decode(credential: str, socket: str = "", timeout_s: float = TIMEOUT_S) -> Decoded:
    """The uid, gid and payload munged vouches for; MungeError (bad, expired, rewound or replayed credential,
    munged down) otherwise."""
    if not credential.startswith("MUNGE:") or not credential.isascii() or not credential.isprintable():
        raise CredentialRefused("not a MUNGE credential")
    lib = library()
    if lib is not None:
        rc, why, decoded = lib.decode_at(credential, socket)
        if decoded is not None:
            return decoded
        raise _decode_failed(rc, why)
    try:
        p = subprocess.run([*_command("unmunge", socket), "--numeric"], input=credential.encode(),
                           capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise MungeError(f"unmunge did not answer within {timeout_s:g} s (is munged running?)") from None
    except OSError as exc:
        raise MungeError(f"cannot run unmunge: {exc.strerror or exc}") from None
    if p.returncode != 0:
        raise _decode_failed(p.returncode, _reason("unmunge", p.stderr.decode("utf-8", "replace"), p.returncode))
    return parse_unmunge(p.stdout)


def _decode_failed(rc: int, why: str) -> MungeError:
    """A decode's failure, the library's or the command's (its exit status is munge_err_t): a credential
    munged refused, or munge's own reason why it could not be decoded."""
    if rc in REFUSED:
        return CredentialRefused(f"credential refused: {REFUSED[rc]}")
    return MungeError(f"unmunge failed: {why}")


def parse_unmunge(out: bytes) -> Decoded:
    """``unmunge --numeric``'s output: ``KEY: value`` lines, a blank line, then the payload as given."""
    raw, sep, payload = out.partition(b"\n\n")
    head = raw.decode("ascii", "replace")
    meta = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()] = value.strip()
    try:
        if not sep or meta.get("STATUS") != "0":
            raise ValueError
        return Decoded(int(meta["UID"]), int(meta["GID"]), payload)
    except (KeyError, ValueError):
        raise MungeError(f"cannot read unmunge's answer: {head[:200]!r}") from None
