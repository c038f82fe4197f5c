"""Finding DCGM's own Python bindings and reaching nv-hostengine, fast and bounded.

DCGM has no PyPI package: its bindings ship with DCGM (``BINDING_DIRS`` or ``dcgm.bindings_path``) and are
imported only inside functions. The job's group, watches and stats must outlive the Prolog's process, so
we connect with ``persistAfterDisconnect = 1`` (embedded mode cannot work across hooks). :func:`probe`
first does a plain socket connect: a dead hostengine costs at most ``dcgm.connect_timeout_s``.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Protocol

    class Summary(Protocol):
        average: object

    class Pid(Protocol):
        pid: int

    class GpuJobStats(Protocol):
        """What we read of DCGM's per-GPU job statistics (``c_dcgmGpuUsageInfo_t``); raw values may be blanks."""

        smUtilization: Summary
        powerUsage: Summary
        energyConsumed: object
        maxGpuMemoryUsed: object
        numXidCriticalErrors: object
        numComputePids: object
        computePids: Sequence[Pid]

DEFAULT_PORT = 5555
BINDING_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",  # DCGM 4.x packages
    "/usr/local/dcgm/bindings/python3",  # DCGM 3.x packages
)

# DCGM status codes (dcgm_structs.DCGM_ST_*; numeric so we need no import to name them).
ST_NO_DATA = -14
ST_DUPLICATE_KEY = -26
ST_PROFILING_MULTI_PASS = -38

_ST_WORDS = {
    ST_NO_DATA: "no data",
    -16: "field not watched",
    -21: "connection to the hostengine lost",
    ST_DUPLICATE_KEY: "duplicate job id",
    -29: "nv-hostengine must run as root for this",
    -33: "DCGM module not loaded",
    -36: "profiling not supported on this GPU",
    ST_PROFILING_MULTI_PASS: "profiling fields need several passes on this GPU",
}


class DcgmUnavailable(Exception):
    """DCGM cannot be used here; ``str()`` is the sentence that goes into the record's reason."""


class Bindings:
    """The imported binding modules (untyped: DCGM ships no type hints) and where they came from."""

    def __init__(self, agent: Any, structs: Any, fields: Any, path: str | None) -> None:
        self.agent = agent
        self.structs = structs
        self.fields = fields
        self.path = path


def status(exc: BaseException) -> int | None:
    """The DCGM status code of a ``dcgm_structs.DCGMError`` (its ``value``), else None."""
    v = getattr(exc, "value", None)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def describe(exc: BaseException) -> str:
    """``DCGM error -26 (duplicate job id: Duplicate key passed to function)``-style text; a DcgmUnavailable as is."""
    if isinstance(exc, DcgmUnavailable):
        return str(exc)
    code = status(exc)
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - DCGMError.__str__ calls into the library
        text = type(exc).__name__
    if code is None:
        return f"{type(exc).__name__}: {text}"
    words = _ST_WORDS.get(code)
    return f"DCGM error {code} ({words}: {text})" if words else f"DCGM error {code} ({text})"


def import_bindings(configured: str = "") -> Bindings:
    """Import DCGM's bindings (lazily, from the first dir that has them); DcgmUnavailable if none does."""
    dirs = [configured] if configured else list(BINDING_DIRS)
    found = next((d for d in dirs if os.path.isfile(os.path.join(d, "dcgm_agent.py"))), None)
    if found is None:
        raise DcgmUnavailable("DCGM Python bindings not found (looked in " + ", ".join(dirs)
                              + "; set dcgm.bindings_path)")
    if found not in sys.path:
        sys.path.insert(0, found)
    try:
        import importlib

        structs = importlib.import_module("dcgm_structs")
        fields = importlib.import_module("dcgm_fields")
        agent = importlib.import_module("dcgm_agent")
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install raising anything
        raise DcgmUnavailable(f"cannot import DCGM bindings from {found}: {type(exc).__name__}: {exc}") from None
    return Bindings(agent, structs, fields, found)


def parse_address(address: str) -> tuple[str, str, int]:
    """``"host"``, ``"host:port"``, ``"[v6]:port"`` or ``"unix:/path"`` -> (kind, host-or-path, port)."""
    a = address.strip()
    if a.startswith("unix:"):
        path = a[5:]
        while path.startswith("//"):
            path = path[1:]
        return "unix", path, 0
    if a.startswith("/"):
        return "unix", a, 0
    if a.startswith("["):
        host, _, rest = a[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return "tcp", host, int(port) if port.isascii() and port.isdigit() else DEFAULT_PORT
    host, sep, port = a.rpartition(":")
    if sep and port.isascii() and port.isdigit() and host:
        return "tcp", host, int(port)
    return "tcp", a, DEFAULT_PORT


def probe(address: str, timeout_s: float) -> str | None:
    """None if something accepts connections at ``address`` within ``timeout_s``, else why not."""
    try:
        kind, where, port = parse_address(address)
    except ValueError as exc:
        return f"bad dcgm.hostengine address {address!r}: {exc}"
    try:
        if kind == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout_s)
                s.connect(where)
        else:
            socket.create_connection((where, port), timeout=timeout_s).close()
    except OSError as exc:
        target = where if kind == "unix" else f"{where}:{port}"
        return f"no nv-hostengine answering at {target} ({exc.strerror or exc})"
    return None


def connect(b: Bindings, address: str, timeout_s: float) -> object:
    """A hostengine handle whose groups, watches and job stats persist after we disconnect."""
    kind, where, port = parse_address(address)
    b.structs._dcgmInit()
    b.agent.dcgmInit()
    params = b.structs.c_dcgmConnectV2Params_v2()
    params.version = b.structs.c_dcgmConnectV2Params_version2
    params.persistAfterDisconnect = 1
    params.timeoutMs = max(1, int(timeout_s * 1000))
    params.addressIsUnixSocket = 1 if kind == "unix" else 0
    target = where if kind == "unix" else f"{where}:{port}"
    return b.agent.dcgmConnect_v2(target, params, b.structs.c_dcgmConnectV2Params_version2)


def disconnect(b: Bindings, handle: object) -> None:
    with contextlib.suppress(Exception):  # nothing useful to do about a failed disconnect
        b.agent.dcgmDisconnect(handle)


def version(b: Bindings) -> str | None:
    """The DCGM library version (``dcgmVersionInfo``'s ``version:`` entry), or None."""
    try:
        raw = b.agent.dcgmVersionInfo().rawBuildInfoString
    except Exception:  # noqa: BLE001 - old bindings or library not loaded
        return None
    raw = raw.decode() if isinstance(raw, bytes) else str(raw)
    for part in raw.split(";"):
        key, _, value = part.partition(":")
        if key.strip() == "version":
            return value.strip()
    return raw or None


# DCGM's blank sentinels: a value not supported or not recorded.
INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0


def i32(v: object) -> int | None:
    return int(v) if isinstance(v, int) and 0 <= v < INT32_BLANK else None


def i64(v: object) -> int | None:
    return int(v) if isinstance(v, int) and 0 <= v < INT64_BLANK else None


def fp64(v: object) -> float | None:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    v = float(v)
    return v if math.isfinite(v) and 0 <= v < FP64_BLANK else None


def handle_int(x: Any) -> int:
    """The number of a group or field-group handle (the bindings return an int or a ctypes c_void_p)."""
    v = getattr(x, "value", x)
    return int(v or 0)


def handle(v: int) -> object:
    import ctypes

    return ctypes.c_void_p(v)
