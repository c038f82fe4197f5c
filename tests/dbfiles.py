"""Database files for the damage, privacy and fuzz tests: a site (config and spool) with real records, a real
database made by ``gpueff ingest``, and ways to damage it."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from hooksite import make_record
from sites import site_config

from slurm_gpueff import spool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_config(d: Path, database: str, extra: str = "") -> Path:
    """``d``/g.toml (``sites.site_config``): ``database`` as written, no ``[site]``."""
    return site_config(d, database, cluster=None, extra=extra, name="g.toml")


def add_records(d: Path, first: int, n: int) -> None:
    for job_id in range(first, first + n):
        spool.write_record(str(d / "spool"), make_record(job_id))


def gpueff(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
           cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", *args], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=cwd)


def one_line(p: subprocess.CompletedProcess[str], prog: str = "gpueff") -> str:
    """The one error line of a failed command (asserted: one line, ``prog: ``, no traceback, no SQL)."""
    assert p.stderr.startswith(f"{prog}: ") and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr and "[SQL" not in p.stderr, p.stderr
    return p.stderr.strip()


def real_database(d: Path, n: int = 300) -> Path:
    """A database made by `gpueff ingest` from ``n`` records (its site's config ``d/g.toml``)."""
    db = d / "db" / "gpueff.db"
    write_config(d, str(db))
    add_records(d, 1, n)
    p = gpueff("--config", str(d / "g.toml"), "ingest")
    assert p.returncode == 0, p.stderr
    return db


def corrupt_pages(db: Path, seed: int = 1, first: int = 2) -> None:
    """Overwrite every third page from page ``first`` (0-based) on with random bytes (page 0, the header and
    the schema's root, survives)."""
    rnd = random.Random(seed)
    size = db.stat().st_size
    page = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as fh:
        for n in range(first, size // page, 3):
            fh.seek(n * page)
            fh.write(rnd.randbytes(page))


def foreign_database(db: Path) -> None:
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
        con.execute("INSERT INTO invoices (amount) VALUES (12.5)")
    con.close()


def copy(src: Path, dst_dir: Path) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / src.name
    shutil.copy(src, dst)
    return dst
