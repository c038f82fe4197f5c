"""One report as a MIME message, and its archive copy on disk.

Shape (what mail clients expect for an HTML mail with an inline image)::

    multipart/alternative
      text/plain                 the plain-text part (reads well alone)
      multipart/related
        text/html                <img src="cid:...">
        image/png                Content-ID: <...>, Content-Disposition: inline

Headers carry no untrusted text unchecked: the subject is passed through :func:`card.clean` (control
characters out), and Python's ``email`` policy refuses CR/LF in any header value, so a job name cannot
add a header. ``Auto-Submitted: auto-generated`` (RFC 3834) keeps vacation responders quiet.

The archive keeps, per message, ``message.eml`` (exactly what was or would be sent, and what a later
retry re-sends), ``<name>.html`` with the chart as a file next to it (opens in any browser), the
plain-text part and ``chart.png``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from email import policy
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import NamedTuple

from ..spool import atomic_write
from .card import clean
from .pages import Page

FILE_MODE = 0o640
_UNFOLDED = policy.SMTP.clone(max_line_length=998)


class Parts(NamedTuple):
    """What a report renders to: subject, text, HTML with ``cid:`` links, images by Content-ID, and the
    HTML again with ``<cid>.png`` file links for the archive."""

    subject: str
    text: str
    html_mail: str
    html_file: str
    images: Mapping[str, bytes]
    name: str  # "card" or "summary": the archive's file names


def parts(page: Page, cid_prefix: str, name: str) -> Parts:
    """The mail and archive forms of a page: its chart inline under a new unique Content-ID, or a file."""
    cid = f"{cid_prefix}.{os.urandom(8).hex()}@slurm-gpueff"
    images = {cid: page.chart} if page.chart else {}
    html_mail = page.html(f"cid:{cid}")
    return Parts(subject=page.subject, text=page.text, html_mail=html_mail,
                 html_file=html_mail.replace(f"cid:{cid}", _image_name(cid)), images=images, name=name)


def build(parts: Parts, *, sender: str, to: Sequence[str], reply_to: str, extra_headers: Mapping[str, str]
          ) -> EmailMessage:
    msg = EmailMessage(policy=policy.SMTP)
    msg["Subject"] = clean(parts.subject, 200)
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    if reply_to:
        msg["Reply-To"] = reply_to
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = make_msgid("gpueff", domain=sender.rpartition("@")[2] or "slurm-gpueff")
    msg["Auto-Submitted"] = "auto-generated"
    msg["X-Auto-Response-Suppress"] = "All"
    for key, value in extra_headers.items():
        msg[key] = clean(value, 200)
    msg.set_content(parts.text, subtype="plain", charset="utf-8", cte="quoted-printable")
    msg.add_alternative(parts.html_mail, subtype="html", charset="utf-8", cte="quoted-printable")
    html = next(p for p in msg.iter_parts() if p.get_content_type() == "text/html")
    for cid, png in parts.images.items():
        html.add_related(png, maintype="image", subtype="png", cid=f"<{cid}>", disposition="inline",
                         filename=_image_name(cid))
    # Headers written unfolded up to RFC 5322's 998: Python's folding at 78 can break a subject straight
    # after "Subject:", and readers then show it with a leading space. The bodies are encoded already.
    msg.policy = _UNFOLDED
    return msg


def _image_name(cid: str) -> str:
    return cid.split("@")[0].split(".")[0] + ".png"


def archive(folder: str, parts: Parts, msg: EmailMessage) -> str:
    """Write the message and its viewable copies into ``folder``; return the ``.eml`` path."""
    os.makedirs(folder, mode=0o750, exist_ok=True)
    eml = os.path.join(folder, "message.eml")
    atomic_write(eml, msg.as_bytes(), FILE_MODE)  # in the message's own policy: SMTP's CRLF
    atomic_write(os.path.join(folder, f"{parts.name}.html"), parts.html_file.encode("utf-8"), FILE_MODE)
    atomic_write(os.path.join(folder, f"{parts.name}.txt"), parts.text.encode("utf-8"), FILE_MODE)
    for cid, png in parts.images.items():
        atomic_write(os.path.join(folder, _image_name(cid)), png, FILE_MODE)
    return eml
