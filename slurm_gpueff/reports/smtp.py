"""SMTP delivery with retries and backoff (settings in ``[mail]``).

A message is tried ``mail.retries`` times in one run, waiting ``backoff_s``, ``2*backoff_s``, ... in
between; permanent refusals (5xx, bad credentials) are not retried in the run, and a 5xx refusal of every
recipient is marked ``refused`` (the address is at fault, not the mail server: the idle-GPU alerts back off
such an address). Whatever still fails is
the caller's to keep for a later run (the sent-log marks it ``failed`` and the archived ``.eml`` is
re-sent), so a mail server outage delays reports but never blocks ingest or loses a message. Every SMTP
conversation is bounded by ``timeout_s``.
"""

from __future__ import annotations

import smtplib
import ssl
import time
from collections.abc import Sequence

from ..config import MailConfig


class DeliveryError(Exception):
    """The message could not be delivered; ``permanent`` when retrying cannot help (5xx, auth); ``refused``
    when the server refused the recipients themselves with 5xx ("550 User unknown")."""

    def __init__(self, message: str, permanent: bool = False, refused: bool = False):
        super().__init__(message)
        self.permanent = permanent
        self.refused = refused


def _password(mail: MailConfig) -> str | None:
    if not mail.password_file:
        return None
    try:
        with open(mail.password_file, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise DeliveryError(f"cannot read mail.password_file {mail.password_file}: {exc.strerror}",
                            permanent=True) from None


def _permanent(exc: BaseException) -> bool:
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return True
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return all(500 <= code < 600 for code, _ in exc.recipients.values())
    code = getattr(exc, "smtp_code", None)
    return isinstance(code, int) and 500 <= code < 600


def _describe(exc: BaseException) -> str:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return "recipients refused: " + "; ".join(
            f"{rcpt} ({code} {msg.decode(errors='replace') if isinstance(msg, bytes) else msg})"
            for rcpt, (code, msg) in exc.recipients.items())
    if isinstance(exc, smtplib.SMTPResponseException):
        err = exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else exc.smtp_error
        return f"SMTP {exc.smtp_code} {err}"
    return f"{type(exc).__name__}: {exc}"


def send_once(mail: MailConfig, recipients: Sequence[str], data: bytes) -> None:
    """One SMTP conversation: connect (plain, STARTTLS or SSL), log in if configured, send."""
    context = ssl.create_default_context()
    password = _password(mail)
    if mail.security == "ssl":
        conn: smtplib.SMTP = smtplib.SMTP_SSL(mail.host, mail.port, timeout=mail.timeout_s, context=context)
    else:
        conn = smtplib.SMTP(mail.host, mail.port, timeout=mail.timeout_s)
    with conn as smtp:
        smtp.ehlo()
        if mail.security == "starttls":
            smtp.starttls(context=context)
            smtp.ehlo()
        if mail.username:
            smtp.login(mail.username, password or "")
        refused = smtp.sendmail(mail.from_address, list(recipients), data)
        if refused:  # some recipients took it, others not: report, but do not resend to everybody
            raise DeliveryError("some recipients refused: " + ", ".join(refused), permanent=True)


def send(mail: MailConfig, recipients: Sequence[str], data: bytes) -> int:
    """Deliver with up to ``mail.retries`` tries; return the number of tries. Raises DeliveryError."""
    last: BaseException | None = None
    for attempt in range(1, mail.retries + 1):
        try:
            send_once(mail, recipients, data)
            return attempt
        except (smtplib.SMTPException, OSError) as exc:
            last = exc
            if _permanent(exc):
                refused = isinstance(exc, smtplib.SMTPRecipientsRefused)  # _permanent: each one a 5xx
                raise DeliveryError(_describe(exc), permanent=True, refused=refused) from None
            if attempt < mail.retries:
                time.sleep(mail.backoff_s * 2 ** (attempt - 1))
    raise DeliveryError(f"{_describe(last)} (after {mail.retries} tries)" if last else "not sent")
