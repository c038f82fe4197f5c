"""MUNGE credentials through libmunge and through the ``munge``/``unmunge`` commands: the same credentials,
the same refusals, in the same words. Everything is real: two private munged (the site's key and another),
the library and the commands of this machine's MUNGE. Root needed (a credential restricted to another uid)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest
from daemons import start_munged

from slurm_gpueff.access import munge

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("munged"), reason="needs root and munged")

GPUSER_UID = int(subprocess.run(["id", "-u", "gpuser"], capture_output=True, text=True).stdout.strip() or 1001)
BACKENDS = ("libmunge", "commands")


@pytest.fixture(scope="module")
def sockets():
    base = tempfile.mkdtemp(prefix="gpueff-munge-", dir="/tmp")  # pytest's own is 0700: gpuser reaches this one
    os.chmod(base, 0o755)
    site, sock = start_munged(base, "site")
    other, other_sock = start_munged(base, "other")
    yield sock, other_sock, os.path.join(base, "gone", "munge.sock")
    for p in (site, other):
        p.kill()
        p.wait()
    shutil.rmtree(base, ignore_errors=True)


def use(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials made and read by ``backend`` from here on in this test."""
    if backend == "commands":
        monkeypatch.setattr(munge, "library", lambda: None)
    else:
        assert munge.library() is not None, "libmunge.so.2 does not load on this machine"


@pytest.mark.parametrize("made_by", BACKENDS)
@pytest.mark.parametrize("read_by", BACKENDS)
def test_a_credential_made_by_one_is_read_by_the_other(sockets, made_by, read_by, monkeypatch):
    sock = sockets[0]
    for payload in (b"", b"x", bytes(range(256)) * 3 + b"\x00\n\n", os.urandom(munge.MAX_PAYLOAD)):
        with monkeypatch.context() as m:
            use(made_by, m)
            cred = munge.encode(payload, sock)
        with monkeypatch.context() as m:
            use(read_by, m)
            got = munge.decode(cred, sock)
        assert got == munge.Decoded(0, 0, payload)


def refusals(sockets, monkeypatch: pytest.MonkeyPatch, backend: str) -> list[tuple[str, str]]:
    """What each kind of bad credential gives through ``backend``: (error type, its one line)."""
    sock, other_sock, gone = sockets
    use(backend, monkeypatch)
    out = []

    def outcome(call) -> tuple[str, str]:
        try:
            call()
        except munge.MungeError as exc:
            return type(exc).__name__, str(exc)
        return "none", ""

    once = munge.encode(b"once", sock)
    munge.decode(once, sock)
    out.append(outcome(lambda: munge.decode(once, sock)))  # replayed
    out.append(outcome(lambda: munge.decode(munge.encode(b"k", other_sock), sock)))  # another key
    out.append(outcome(lambda: munge.decode(munge.encode(b"u", sock, for_uid=GPUSER_UID), sock)))  # not for root
    out.append(outcome(lambda: munge.decode("MUNGE:AAAAforged:", sock)))
    out.append(outcome(lambda: munge.encode(b"x", gone)))  # munged down
    out.append(outcome(lambda: munge.decode(munge.encode(b"x", sock), gone)))
    return out


def test_both_refuse_alike_in_munges_own_words(sockets, monkeypatch):
    with monkeypatch.context() as m:
        lib = refusals(sockets, m, "libmunge")
    with monkeypatch.context() as m:
        cmd = refusals(sockets, m, "commands")
    kinds = [k for k, _ in lib]
    assert kinds == ["CredentialRefused"] * 4 + ["MungeError"] * 2
    assert [k for k, _ in cmd] == kinds
    assert "replayed" in lib[0][1] and "unauthorized" in lib[2][1]
    assert lib[:4] == cmd[:4]  # a refusal is munge_err_t's text, whoever decoded
    for (_, a), (_, b) in zip(lib[4:], cmd[4:], strict=True):  # munged down: munge's reason, the socket named
        assert "munged" in a and sockets[2] in a, a
        assert a.split(":", 1)[0] == b.split(":", 1)[0], (a, b)


def test_a_credential_restricted_to_a_uid_opens_for_that_uid_only(sockets):
    """A credential the library restricts to a uid opens for the command run as that uid; one the command
    restricts does not open for the library run as root."""
    sock = sockets[0]
    cred = munge.encode(b"for gpuser", sock, for_uid=GPUSER_UID)
    r = subprocess.run(["setpriv", f"--reuid={GPUSER_UID}", f"--regid={GPUSER_UID}", "--clear-groups", "unmunge",
                        "--socket", sock], input=cred.encode(), capture_output=True, check=False)
    assert r.returncode == 0 and r.stdout.endswith(b"\n\nfor gpuser"), r.stderr
    with pytest.MonkeyPatch.context() as m:  # made by the command, read by the library as root: refused
        use("commands", m)
        cred = munge.encode(b"for gpuser", sock, for_uid=GPUSER_UID)
    with pytest.raises(munge.CredentialRefused, match="unauthorized"):
        munge.decode(cred, sock)
