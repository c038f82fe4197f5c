"""Sealed messages: what ``gpueff serve`` and its clients send each other, readable only by the one each is
for, and proving who made it. Built on MUNGE (access/munge.py), which every Slurm host already runs.

Why. MUNGE alone proved the client to the service; nothing proved the service to the client. While the
service was down, an ordinary user could bind its port, take a user's signed request and replay it to the
real service once it was back, and read the user's card in the answer. Now both directions are sealed:

- a **request** is sealed for the service's account (``[service] user``): munged decodes it for that uid
  only, so whoever else receives it reads nothing; the service learns the sender's uid from munged;
- an **answer** is sealed by the service for the uid that asked, and names the request it answers (the
  SHA-256 of the request's envelope, a credential never made twice). The client opens it only if munged
  says the service's account made it; a relayed request gives the relayer an answer it cannot open, and an
  old answer cannot stand in for a new one. munged refuses a credential decoded twice: a replay fails.

Why not TLS: it would need a certificate and a key on the service host, trust anchors on every login node
and node, and their renewal; MUNGE's key is already on every host and already trusted for exactly this
(Slurm's own messages). Like Slurm's, a sealed message is encrypted with the site's MUNGE key (root of any
host of the site can read it; root can anyway).

A message: its payload compressed (zlib), then the **envelope**, one credential carrying a JSON head line
and the first :data:`INLINE` bytes, and, for a larger payload, **parts** of up to ``munge.MAX_PAYLOAD``
bytes, one credential a line, whose SHA-256 the head names. A request's envelope goes in its
``Authorization: MUNGE`` header, so the service knows the sender before it reads a body; an answer's in
its ``Gpueff-Seal`` header. Parts travel as the HTTP body. Stdlib only (``seff-gpu`` seals its queries).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import NamedTuple

from ..errors import GpueffError
from . import munge

VERSION = 1
INLINE = 12 * 1024  # payload bytes (compressed) in the envelope: a query needs no body; a header stays < 20 kB
MAX_HEAD = 4096  # bytes of the head line
SEAL_HEADER = "Gpueff-Seal"  # the answer's envelope
CONTENT_TYPE = "application/x-gpueff-sealed"


class SealError(GpueffError):
    """A message that cannot be opened: not sealed, cut, altered, or larger than allowed."""


class TooLarge(SealError):
    """The payload is larger than the receiver takes."""


class Sealed(NamedTuple):
    """A sealed message as it travels: the envelope (a header's value) and the parts (the body)."""

    envelope: str
    parts: bytes


class Envelope(NamedTuple):
    """An opened envelope: who made it (munged says), its head, and the payload's first bytes."""

    uid: int
    head: dict[str, object]
    first: bytes


def digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def seal(payload: bytes, for_uid: int | None, socket: str, timeout_s: float,
         head: dict[str, object] | None = None) -> Sealed:
    """``payload`` sealed for ``for_uid`` (None: for anyone; only what is not private, e.g. a refusal),
    made by this process's uid; ``head``: what else the receiver must see, e.g. the request an answer is for.
    MungeError when munged cannot make the credentials."""
    packed = zlib.compress(payload, 1)
    first, rest = packed[:INLINE], packed[INLINE:]
    parts = [munge.encode(rest[i:i + munge.MAX_PAYLOAD], socket, timeout_s, for_uid=for_uid)
             for i in range(0, len(rest), munge.MAX_PAYLOAD)]
    body = "\n".join(parts).encode()
    line = json.dumps({"v": VERSION, "parts": len(parts), "sha256": digest(body), **(head or {})},
                      separators=(",", ":")).encode()
    return Sealed(munge.encode(line + b"\n" + first, socket, timeout_s, for_uid=for_uid), body)


def open_envelope(envelope: str, socket: str, timeout_s: float) -> Envelope:
    """The envelope opened by munged (CredentialRefused: not valid, not for this uid, replayed, expired;
    MungeError: munged cannot answer; SealError: a credential, but not an envelope of ours)."""
    decoded = munge.decode(envelope.strip(), socket, timeout_s)
    line, sep, first = decoded.payload.partition(b"\n")
    try:
        head = json.loads(line) if sep and len(line) <= MAX_HEAD else None
    except (ValueError, RecursionError):  # anyone with a credential chooses these bytes: "[[[[..." included
        head = None
    if not isinstance(head, dict) or head.get("v") != VERSION or not isinstance(head.get("parts"), int) \
            or isinstance(head.get("parts"), bool) or not isinstance(head.get("sha256"), str):
        raise SealError(f"uid {decoded.uid}: a credential, but not a sealed gpueff message")
    return Envelope(decoded.uid, head, first)


def open_parts(env: Envelope, body: bytes, limit: int, socket: str, timeout_s: float) -> bytes:
    """The whole payload of an opened envelope and its parts (the body as received), at most ``limit``
    bytes (TooLarge beyond). Every part must be made by the envelope's maker, the body be exactly what the
    head names."""
    if not isinstance(env.head["parts"], int) or env.head["parts"] > max_parts(limit):  # each costs an unmunge
        raise TooLarge(f"the message is larger than {limit} bytes")
    if digest(body) != env.head["sha256"]:
        raise SealError(f"uid {env.uid}: the body is not the one the envelope was sealed with")
    lines = body.split(b"\n") if body else []
    if len(lines) != env.head["parts"]:
        raise SealError(f"uid {env.uid}: {len(lines)} parts, the envelope names {env.head['parts']}")
    packed = [env.first]
    for line in lines:
        part = munge.decode(line.decode("ascii", "replace"), socket, timeout_s)
        if part.uid != env.uid:
            raise SealError(f"uid {env.uid}: a part was made by uid {part.uid}")
        packed.append(part.payload)
    inflate = zlib.decompressobj()
    try:
        payload = inflate.decompress(b"".join(packed), limit + 1)
    except zlib.error:
        raise SealError(f"uid {env.uid}: the payload is not what was sealed (cannot inflate it)") from None
    if len(payload) > limit or inflate.unconsumed_tail:
        raise TooLarge(f"the message is larger than {limit} bytes")
    if not inflate.eof:
        raise SealError(f"uid {env.uid}: the payload is cut short")
    return payload


def max_parts(limit: int) -> int:
    """The most parts a payload of ``limit`` bytes is sealed in (compressed, it is never much larger)."""
    return limit // munge.MAX_PAYLOAD + 2


def wire_limit(limit: int) -> int:
    """The most body bytes a sealed payload of ``limit`` bytes can take on the wire (incompressible data:
    zlib's few bytes more, base64's 4/3, a credential's header a part): larger bodies are refused unread."""
    return (limit + 64 + limit // 1000) * 4 // 3 + max_parts(limit) * 512
