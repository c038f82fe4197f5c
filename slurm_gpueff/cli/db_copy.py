"""``gpueff db copy --from SRC``: another database (a site's SQLite history) into the configured one.

The destination is the configured database, not a URL on the command line: it is opened as every command
opens it, with ``paths.database_password_file``, so no password is ever typed, shown by ``ps`` or kept in a
shell's history. For the same reason a ``--from`` URL that holds a password is refused (libpq's
``~/.pgpass`` or ``PGPASSFILE`` give one to a server source). The copy itself is storage/dbcopy.py.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import GpueffError
from .common import ProgressBar, UsageError, database, database_error

if TYPE_CHECKING:
    from ..config import Config


def db_copy(config: Config, source: str, force: bool, quiet: bool) -> int:
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import make_url

    from ..storage.db import create_private, first_line, make_engine
    from ..storage.dbcopy import CopyFailed, CopyRefused, copy_database
    from ..storage.dburl import database_url, safe_url, sqlite_file

    url = database_url(source)
    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        raise UsageError(f"--from {source!r}: not a database URL or file path") from None
    if parsed.password is not None:
        raise UsageError("--from must not hold a password (the command line is visible to every user): give "
                         "it through ~/.pgpass or PGPASSFILE")
    shown, into = safe_url(url), safe_url(config.paths.database)
    src_file = sqlite_file(url)
    if src_file and not os.path.isfile(src_file):
        raise GpueffError(f"db copy: the source {src_file} does not exist or is not a file")
    dst_file = sqlite_file(database_url(config.paths.database))
    if dst_file:
        create_private(dst_file)  # 0600 in a 0700 directory, before SQLite makes it with the umask's mode
    try:
        src = make_engine(url, create=False, read_only=True)
    except (GpueffError, sa_exc.SQLAlchemyError, OSError, ValueError) as exc:
        raise GpueffError(f"db copy: cannot open the source {shown}: {first_line(exc)}") from None
    progress = ProgressBar("copy", quiet)
    try:
        with database(config, create=False) as dst:
            try:
                result = copy_database(src, dst, replace=force, progress=progress)
            except CopyRefused as exc:
                raise GpueffError(f"db copy from {shown} into {into}: {exc}; nothing was written") from None
            except CopyFailed as exc:
                raise database_error(config, f"db copy from {shown} into {into} failed at table {exc.table}, "
                                             f"nothing was written: {first_line(exc.error)}") from None
            except sa_exc.SQLAlchemyError as exc:
                raise database_error(config, f"db copy from {shown} into {into} failed, nothing was written: "
                                             f"{first_line(exc)}") from None
    finally:
        progress.close()
        src.dispose()
    if result.made_schema:
        print(f"{into}: had no schema: {result.made_schema}")
    print(f"copied {shown} into {into}: {result.rows:,} rows in {result.seconds:.1f} s")
    width = max(len(name) for name in result.source)
    print(f"  {'table':<{width}}  {'source':>12}  {'destination':>12}")
    for name, n in result.source.items():
        got = result.destination.get(name, 0)
        print(f"  {name:<{width}}  {n:>12,}  {got:>12,}" + ("" if got == n else "  DIFFERENT"))
    if not result.equal:
        print("row counts DIFFER: the copy is incomplete; do not use the destination")
        return 1
    print("row counts equal in every table")
    return 0
