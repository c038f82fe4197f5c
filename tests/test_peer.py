"""Who is at the other end of a TCP connection on this host: the kernel's own tables (/proc/net/tcp, tcp6),
read for real over real loopback connections, among many others as on a busy host."""

from __future__ import annotations

import os
import socket

import pytest

from slurm_gpueff.access import peer


@pytest.fixture()
def busy_host():
    """A listener with 300 idle connections to it: the table a lookup has to pick its socket from."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)
    held = []
    for _ in range(300):
        held.append(socket.create_connection(srv.getsockname()))
        held.append(srv.accept()[0])
    yield srv
    for s in [*held, srv]:
        s.close()


@pytest.mark.parametrize("family,listen,connect", [(socket.AF_INET, "127.0.0.1", "127.0.0.1"),
                                                    (socket.AF_INET6, "::", "::1"),
                                                    (socket.AF_INET6, "::", "127.0.0.1")])
def test_the_peer_is_found_by_its_ports_as_by_the_whole_table(busy_host, family, listen, connect):
    """The lookup parses only the lines of the connection's two ports, and finds what reading every line
    finds: the listening process's uid, for IPv4, IPv6 and an IPv4 client of a dual-stack listener."""
    srv = socket.socket(family)
    srv.bind((listen, 0))
    srv.listen(1)
    with srv, socket.create_connection((connect, srv.getsockname()[1])) as c:
        srv.accept()[0].close()
        me, them = peer._endpoint(c.getsockname()), peer._endpoint(c.getpeername())  # noqa: SLF001 - the check
        whole = [uid for local, remote, _s, uid, _i in peer._tcp_sockets() if (local, remote) == (them, me)]  # noqa: SLF001
        assert whole == [os.geteuid()]
        assert peer.peer_uid(c) == os.geteuid()
    assert len(peer._tcp_sockets((them[1], me[1]))) <= 2  # noqa: SLF001 - only this connection's lines were parsed
