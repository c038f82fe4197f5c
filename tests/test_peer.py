"""Who is at the other end of a TCP connection on this host: the kernel asked over netlink (sock_diag), or
its tables (/proc/net/tcp, tcp6) where netlink cannot be asked, for real over real loopback connections,
among many others as on a busy host."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time

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
        assert peer._socket_uid(them, me) == os.geteuid()  # noqa: SLF001 - netlink's answer, the same
    assert len(peer._tcp_sockets((them[1], me[1]))) <= 2  # noqa: SLF001 - only this connection's lines were parsed


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to run a listener as another user")
@pytest.mark.parametrize("netlink", [True, False], ids=["netlink", "tables"])
def test_the_owner_of_another_users_listener_is_named(monkeypatch, netlink):
    """An ordinary user's process holding a port (a squatter on the service's): both ways of asking name
    its uid, not ours, for the connection we made to it; and a connection that is not there is None."""
    monkeypatch.setattr(peer, "_NETLINK", [] if netlink else [False])  # asked afresh, or known not to answer
    try:
        uid = pwd.getpwnam("gpuser").pw_uid
    except KeyError:
        pytest.skip("no user gpuser (tests/setup-services.sh makes it)")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    code = f"import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen(4)\ntime.sleep(30)"
    squatter = subprocess.Popen(["runuser", "-u", "gpuser", "--", "/usr/bin/python3", "-c", code])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                c = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline, "the squatter never listened"
                time.sleep(0.05)
        with c:
            assert peer.peer_uid(c) == uid != os.geteuid()
            (answers,) = peer._NETLINK  # noqa: SLF001 - the way asked: this kernel answers netlink
            assert answers is netlink
            me, them = peer._endpoint(c.getsockname()), peer._endpoint(c.getpeername())  # noqa: SLF001
        if netlink:
            assert peer._socket_uid(them, (me[0], 1)) is None  # noqa: SLF001 - no such connection
    finally:
        squatter.kill()
        squatter.wait()
