"""``gpueff hook install DIR``: write Prolog and Epilog scripts that slurmd can run as they are.

slurmd runs hooks as root with no PATH and no HOME, so ``#!/usr/bin/env python3`` would find only
/usr/bin/python3 (which may be too old, or lack this package). These scripts name ``sys.executable``
(e.g. the venv's python) in their shebang. When the package is not installed (it runs from a source
checkout), the checkout is put on ``sys.path`` explicitly.
"""

from __future__ import annotations

import os
import sys

from .. import outfile
from ..hook import KINDS

_TEMPLATE = '''#!{python}
"""slurm-gpueff Slurm {kind}, written by `gpueff hook install` for this Python.

slurm.conf: {Kind}={path}   (slurmd runs it as root, without PATH or HOME; it always exits 0)
"""
import sys

try:
{path_line}    from slurm_gpueff import hook
except BaseException as exc:  # a broken install must not drain the node
    line = "{kind}: cannot import slurm_gpueff: %r" % (exc,)
    try:  # to stderr and to syslog (slurmd may keep no stderr); neither may fail the hook
        sys.stderr.write("slurm-gpueff %s\\n" % line)
    except BaseException:
        pass
    try:
        import syslog
        syslog.openlog("slurm-gpueff", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR, line)
    except BaseException:
        pass
    sys.exit(0)
{call}
'''


def install_hooks(dest_dir: str, config_path: str | None = None, python: str | None = None,
                  force: bool = False) -> list[str]:
    """Write ``prolog`` and ``epilog`` into ``dest_dir`` with an absolute shebang to this Python; with
    ``config_path`` they read that config file, not the default one (slurmd passes no GPUEFF_CONFIG).
    Existing scripts are replaced only with ``force`` (outfile.py: a symbolic link there is replaced itself,
    never followed); otherwise :class:`outfile.OutputExists` names the first one, before either is written.

    ``python``: another interpreter for the shebang, for a slurmd that cannot run this one (a slurmd in a
    chroot has its own python3); it is given this package's directory, as the hook path is stdlib-only."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above slurm_gpueff/
    installed = os.path.basename(pkg_parent) in ("site-packages", "dist-packages") and python is None
    path_line = "" if installed else f"    sys.path.insert(0, {pkg_parent!r})\n"
    os.makedirs(dest_dir, mode=0o755, exist_ok=True)
    out = [os.path.join(os.path.abspath(dest_dir), kind) for kind in KINDS]
    for path in out:
        outfile.refuse_existing(path, force)
    for kind, path in zip(KINDS, out, strict=True):
        call = (f"hook.{kind}_main()" if config_path is None else
                f"hook.main({kind!r}, {os.path.abspath(config_path)!r})")
        text = _TEMPLATE.format(python=python or sys.executable, kind=kind, Kind=kind.capitalize(), path=path,
                                path_line=path_line, call=call)
        outfile.write(path, text.encode(), force=force, mode=0o755, exact_mode=True)
    return out
