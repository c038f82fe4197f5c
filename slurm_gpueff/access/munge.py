"""MUNGE credentials through the ``munge`` and ``unmunge`` commands: how ``seff-gpu`` proves who runs it to
``gpueff serve``'s API, and how the service learns the caller's uid.

Every Slurm cluster runs ``munged`` on every host with one shared key, so a credential made on a login node
decodes on the service host, and only munged (running as its own user, reading the caller's uid from the
socket) can put a uid in it: a user cannot claim to be another. The payload binds a credential to one
request (the caller puts the SHA-256 of the request body in it, the service recomputes it), and munged
itself refuses a credential decoded twice ("replayed") or past its time-to-live ("expired").

Stdlib only, every call bounded in time; a failure is a :class:`MungeError` saying why in one line.
"""

from __future__ import annotations

import hashlib
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
           18: "unauthorized credential"}


class MungeError(GpueffError):
    """munge/unmunge is missing, munged does not answer, or the credential is not valid."""


class CredentialRefused(MungeError):
    """munged decoded the credential and refused it (invalid, expired, rewound, replayed, another key)."""


class Decoded(NamedTuple):
    """What munged vouches for: the uid and gid of the process that made the credential, and its payload."""

    uid: int
    gid: int
    payload: str


def body_digest(body: bytes) -> str:
    """The payload that binds a credential to one request: the SHA-256 hex of its body."""
    return hashlib.sha256(body).hexdigest()


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


def encode(payload: str, socket: str = "", timeout_s: float = TIMEOUT_S) -> str:
    """A credential for ``payload`` from the local munged, naming the calling process's uid."""
    try:
        p = subprocess.run([*_command("munge", socket), "--no-input", "--string", payload], capture_output=True,
                           text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise MungeError(f"munge did not answer within {timeout_s:g} s (is munged running?)") from None
    except OSError as exc:
        raise MungeError(f"cannot run munge: {exc.strerror or exc}") from None
    cred = p.stdout.strip()
    if p.returncode != 0 or not cred.startswith("MUNGE:"):
        raise MungeError(f"munge cannot make a credential: {_reason('munge', p.stderr, p.returncode)}")
    return cred


def decode(credential: str, socket: str = "", timeout_s: float = TIMEOUT_S) -> Decoded:
    """The uid, gid and payload munged vouches for; MungeError (bad, expired, rewound or replayed credential,
    munged down) otherwise."""
    if not credential.startswith("MUNGE:") or "\n" in credential:
        raise CredentialRefused("not a MUNGE credential")
    try:
        p = subprocess.run([*_command("unmunge", socket), "--numeric"], input=credential, capture_output=True,
                           text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise MungeError(f"unmunge did not answer within {timeout_s:g} s (is munged running?)") from None
    except OSError as exc:
        raise MungeError(f"cannot run unmunge: {exc.strerror or exc}") from None
    if p.returncode != 0:
        if p.returncode in REFUSED:
            raise CredentialRefused(f"credential refused: {REFUSED[p.returncode]}")
        raise MungeError(f"unmunge failed: {_reason('unmunge', p.stderr, p.returncode)}")
    return parse_unmunge(p.stdout)


def parse_unmunge(text: str) -> Decoded:
    """``unmunge --numeric``'s output: ``KEY: value`` lines, a blank line, then the payload as given."""
    head, sep, payload = text.partition("\n\n")
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
