"""A real SMTP server (aiosmtpd) on loopback for the tests that send mail: it keeps what it accepts."""

from __future__ import annotations

import email
import socket
from email import policy

import pytest


class Inbox:
    """aiosmtpd handler that keeps every message it accepts (envelope and parsed content)."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.EmailMessage]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        msg = email.message_from_bytes(envelope.original_content or envelope.content, policy=policy.default)
        self.messages.append((list(envelope.rcpt_tos), msg))
        return "250 OK"


class RefusingInbox(Inbox):
    """An Inbox that refuses recipients until ``accept`` is set: mail that cannot be delivered. ``reply`` is
    the refusal (550, permanent, by default; a 4xx one is temporary); ``only``, when set, names the addresses
    refused (the others are accepted); ``asked`` counts every RCPT the server was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.accept = False
        self.reply = "550 5.1.1 mailbox unavailable"
        self.only: set[str] | None = None
        self.asked: list[str] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 - aiosmtpd's
        self.asked.append(address)
        if not self.accept and (self.only is None or address in self.only):
            return self.reply
        envelope.rcpt_tos.append(address)
        return "250 OK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp_server():
    yield from _serve(Inbox())


@pytest.fixture
def refusing_smtp_server():
    """A real SMTP server that refuses every recipient until ``inbox.accept = True``."""
    yield from _serve(RefusingInbox())


def _serve(inbox: Inbox):
    from aiosmtpd.controller import Controller

    port = free_port()
    ctl = Controller(inbox, hostname="127.0.0.1", port=port)
    ctl.start()
    try:
        yield inbox, port
    finally:
        ctl.stop()
