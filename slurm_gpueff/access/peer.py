"""Who is at the other end of a socket on this host, and who holds a TCP port: what the kernel says, not
what the process claims.

Two uses. A client about to hand a request to ``gpueff serve`` on this host checks that the process it
reached runs as the service's account before it sends a byte: an ordinary user who bound the service's
port while it was down (an upgrade, a restart) is named and refused at once (access/client.py). And
``gpueff serve``, finding its port taken, says who holds it rather than "Address already in use".

A Unix socket's peer comes from ``SO_PEERCRED``. A TCP connection's is the owner of its accepting end
(local address = our peer, remote address = us) when the peer is on this host, and a port's is the owner of
its listening socket. The kernel is asked for the one socket by its addresses over netlink (``sock_diag``,
as ``ss`` asks, no privilege needed): a client asks at every request, and reading ``/proc/net/tcp`` and
``tcp6``, which list every socket of the network namespace, costs milliseconds on a busy host (a login
node, a node of a distributed job, a site bench's thousands of nodes on one host). Where netlink cannot be
asked (a sandbox without it) the tables are read instead. A peer on another host is not known to this
kernel: its answer must prove itself (access/sealed.py). Linux only; elsewhere nothing is known (None),
and the sealed answer still decides. Stdlib only: ``seff-gpu`` imports this.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import struct
from typing import NamedTuple

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the st column of a listening socket (include/net/tcp_states.h: TCP_LISTEN = 10)
# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
DIAG_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, extensions, pad, states
SOCKID_PORTS = struct.Struct(">HH")  # inet_diag_sockid: source and destination port, network order ...
SOCKID_REST = struct.Struct("=III")  # ... after the two 16-byte addresses: interface, cookie (two words)
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: any socket with these addresses
MSG_UID_AT = 64  # inet_diag_msg: family, state, timer, retrans (4 bytes), sockid (48), expires, queues (12), uid


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
    if _netlink_works(me, them):
        try:
            return _socket_uid(them, me)
        except OSError:
            pass
    for local, remote, _state, uid, _inode in _tcp_sockets((them[1], me[1])):
        if local == them and remote == me:
            return uid
    return None


def _socket_uid(local: _Endpoint, remote: _Endpoint) -> int | None:
    """The owner of the TCP socket with these addresses, asked of the kernel over netlink (sock_diag's exact
    lookup); None if there is none. OSError where the kernel cannot be asked or gives no clear answer."""
    family = socket.AF_INET if local[0].version == 4 else socket.AF_INET6
    sockid = (SOCKID_PORTS.pack(local[1], remote[1]) + local[0].packed.ljust(16, b"\0")
              + remote[0].packed.ljust(16, b"\0") + SOCKID_REST.pack(0, NO_COOKIE, NO_COOKIE))
    body = DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body,
                  (0, 0))
        data = nl.recv(8192)
    _length, kind, _flags, _seq, _port = NLMSG_HEADER.unpack_from(data)
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("=i", data, NLMSG_HEADER.size)[0]
        if code == errno.ENOENT:
            return None
        raise OSError(code, os.strerror(code))
    at = NLMSG_HEADER.size
    if kind != SOCK_DIAG_BY_FAMILY or len(data) < at + MSG_UID_AT + 4:
        raise OSError(errno.EPROTO, "sock_diag: an answer of another kind")
    if SOCKID_PORTS.unpack_from(data, at + 4) != (local[1], remote[1]):  # a listener stands in for a lost one
        return None
    return int(struct.unpack_from("=I", data, at + MSG_UID_AT)[0])


_NETLINK: list[bool] = []  # once asked: whether the kernel answers sock_diag's lookups in this process


def _netlink_works(me: _Endpoint, them: _Endpoint) -> bool:
    """Whether the kernel answers sock_diag's lookups here, found once a process by asking for our own end
    of a connection, which exists: "no such socket" is also what a kernel without its TCP handler says."""
    if not _NETLINK:
        try:
            works = _socket_uid(me, them) is not None
        except OSError:
            works = False
        _NETLINK.append(works)
    return _NETLINK[0]


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
