"""Who is at the other end of a socket on this host, and who holds a TCP port: what the kernel says, not
what the process claims.

Two uses. A client about to hand a request to ``gpueff serve`` on this host checks that the process it
reached runs as the service's account before it sends a byte: an ordinary user who bound the service's
port while it was down (an upgrade, a restart) is named and refused at once (access/client.py). And
``gpueff serve``, finding its port taken, says who holds it rather than "Address already in use".

A Unix socket's peer comes from ``SO_PEERCRED``; a TCP connection's from ``/proc/net/tcp`` and ``tcp6``,
where the kernel lists every socket of this network namespace with its owner's uid: the accepting end of
our connection (local address = our peer, remote address = us) when the peer is on this host, the
listening one for a port. A peer on another host is not listed: its answer must prove itself
(access/sealed.py). Linux only; elsewhere nothing is known (None), and the sealed answer still decides.
Stdlib only: ``seff-gpu`` imports this.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct
from typing import NamedTuple

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the st column of a listening socket (include/net/tcp_states.h: TCP_LISTEN = 10)


class Holder(NamedTuple):
    """A socket's owner: its uid, and the processes holding it that this user may see (pid, command)."""

    uid: int
    processes: tuple[tuple[int, str], ...] = ()

    def describe(self) -> str:
        """``uid 1001 (alice), pid 4242 (python3)``: as much as is known."""
        from .privacy import user_name

        name = user_name(self.uid)
        who = f"uid {self.uid}" + (f" ({name})" if name else "")
        procs = ", ".join(f"pid {pid} ({comm})" if comm else f"pid {pid}" for pid, comm in self.processes)
        return f"{who}, {procs}" if procs else who


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected socket, where this host's kernel knows it
    (a Unix socket, or TCP to an address of this host); None otherwise."""
    try:
        if sock.family == socket.AF_UNIX:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[1])
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        me = _endpoint(sock.getsockname())
        them = _endpoint(sock.getpeername())
    except (OSError, ValueError, AttributeError):
        return None
    for local, remote, _state, uid, _inode in _tcp_sockets((them[1], me[1])):
        if local == them and remote == me:
            return uid
    return None


def port_holder(port: int) -> Holder | None:
    """Who listens on TCP ``port`` on this host (any address), or None if nobody, or it cannot be read."""
    for (_addr, p), _remote, state, uid, inode in _tcp_sockets():
        if p == port and state == LISTEN:
            return Holder(uid, tuple(_processes(inode)))
    return None


def unix_holder(sock: socket.socket) -> Holder | None:
    """Who is at the other end of a connected Unix socket."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, _gid = struct.unpack("3i", creds)
    return Holder(uid, ((pid, _comm(pid)),) if pid > 0 else ())


_Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def _endpoint(addr: tuple[str, int] | tuple[str, int, int, int]) -> _Endpoint:
    ip = ipaddress.ip_address(addr[0].split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, int(addr[1])  # an IPv4 peer of a dual-stack socket, as tcp (not tcp6) lists it
    return ip, int(addr[1])


def _tcp_sockets(ports: tuple[int, int] | None = None) -> list[tuple[_Endpoint, _Endpoint, str, int, int]]:
    """Every TCP socket the kernel lists: (local, remote, state, uid, inode); with ``ports`` (local, remote),
    only those between these ports. A client asks at every request, and a host's table can hold thousands of
    sockets (a node of a distributed job, a site bench's nodes on one host): the lines are picked from the
    table's text by their ports first, so only those few are parsed."""
    pick = None if ports is None else re.compile(
        rf"^ *\d+: [0-9A-F]+:{ports[0]:04X} [0-9A-F]+:{ports[1]:04X} .*$", re.MULTILINE)
    out = []
    for table in TCP_TABLES:
        try:
            with open(table, encoding="ascii") as fh:
                text = fh.read()
        except OSError:
            continue
        lines = text.splitlines()[1:] if pick is None else pick.findall(text)
        for line in lines:
            f = line.split()
            try:
                out.append((_hex_endpoint(f[1]), _hex_endpoint(f[2]), f[3], int(f[7]), int(f[9])))
            except (IndexError, ValueError):
                continue
    return out


def _hex_endpoint(text: str) -> _Endpoint:
    """``0100007F:1F90`` -> (127.0.0.1, 8080): the address is 32-bit words in the host's byte order."""
    addr, _, port = text.partition(":")
    raw = bytes.fromhex(addr)
    words = b"".join(struct.pack("=I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(port, 16)


def _processes(inode: int) -> list[tuple[int, str]]:
    """The processes with the socket ``inode`` open, among those whose descriptors this user may read."""
    target = f"socket:[{inode}]"
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isascii() and p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    found.append((pid, _comm(pid)))
                    break
            except OSError:
                continue
    return found


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""
