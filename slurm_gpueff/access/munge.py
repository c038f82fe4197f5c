"""MUNGE credentials through the ``munge`` and ``unmunge`` commands: how ``gpueff serve`` and its clients
(``seff-gpu``, ``gpueff forward``, doctor) prove to each other who they are (access/sealed.py builds on this).

Every Slurm cluster runs ``munged`` on every host with one shared key, so a credential made on a login node
decodes on the service host, and only munged (running as its own user, reading the caller's uid from the
socket) can put a uid in it: nobody can claim to be another. munged encrypts the payload with the site's
key, decodes a credential restricted to a uid (``--restrict-uid``) only for that uid, and refuses one
decoded twice ("replayed") or past its time-to-live ("expired").

Stdlib only, every call bounded in time; a failure is a :class:`MungeError` saying why in one line.
"""

from __future__ import annotations

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


def encode(payload: bytes, socket: str = "", timeout_s: float = TIMEOUT_S, *, for_uid: int | None = None) -> str:
    """A credential for ``payload`` (at most :data:`MAX_PAYLOAD` bytes) from the local munged, naming the
    calling process's uid; with ``for_uid``, only that uid can decode it (and read the payload)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a credential carries at most {MAX_PAYLOAD} bytes, not {len(payload)}")
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
    try:
        p = subprocess.run([*_command("unmunge", socket), "--numeric"], input=credential.encode(),
                           capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise MungeError(f"unmunge did not answer within {timeout_s:g} s (is munged running?)") from None
    except OSError as exc:
        raise MungeError(f"cannot run unmunge: {exc.strerror or exc}") from None
    if p.returncode != 0:
        if p.returncode in REFUSED:
            raise CredentialRefused(f"credential refused: {REFUSED[p.returncode]}")
        raise MungeError(f"unmunge failed: {_reason('unmunge', p.stderr.decode('utf-8', 'replace'), p.returncode)}")
    return parse_unmunge(p.stdout)


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
