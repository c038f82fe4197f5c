"""Property-based: no database value, URL or file ends in a traceback. At least the Hypothesis profile's count
(1,000 in CI, 10,000 with ``deep``) generated cases per test (counted in the test), each through the real
commands in-process: a defined exit status (0, 1 or 2) and, on failure, exactly one stderr line
``gpueff: ...`` / ``seff-gpu: ...``.

Server URLs point at 127.0.0.1 on a port nothing listens on, and seff-gpu finds no Slurm commands, so that
no case waits on the network.
"""

from __future__ import annotations

import gc
import json
import os
import random
from pathlib import Path

import pytest
from dbfiles import real_database
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_gpueff.cli import doctor, gpueff, seff
from slurm_gpueff.cli.common import run_command
from slurm_gpueff.storage import migrate

CASES = settings.default.max_examples  # the active Hypothesis profile's: 1,000 (ci) or 10,000 (deep); conftest.py
FUZZ = settings(suppress_health_check=list(HealthCheck))


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (JSON's escapes are TOML's, but for lone surrogates: those make
    the config itself invalid, which is one more defined outcome)."""
    return json.dumps(value)


def outcome(capsys, code: int, prog: str) -> str:
    """stdout, after checking the exit status and stderr: a failure is one ``prog: `` line, or (``gpueff db
    current``'s "needs `gpueff db upgrade`", exit 1) a status line on stdout and nothing on stderr."""
    out, err = capsys.readouterr()
    assert code in ((0, 1, 2, 3, 4, 5, 6) if prog == "seff-gpu" else (0, 1, 2)), (code, err)
    assert "Traceback" not in err
    if code and not (code == 1 and err == "" and out.count("\n") == 1):
        assert err.startswith(f"{prog}: ") and err.count("\n") == 1, (err, out)
    return out


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


PORT = closed_port()
PART = st.text(max_size=24)
URL = st.builds(lambda user, db, query, port: f"postgresql+psycopg://{user}@127.0.0.1:{port}/{db}?"
                                              f"connect_timeout=1&{query}",
                PART, PART, PART, st.one_of(st.just(str(PORT)), PART))
VALUE = st.one_of(st.text(max_size=60), URL, st.text(max_size=30).map(lambda t: "sqlite:///" + t),
                  st.text(max_size=30).map(lambda t: t + "://" + t))


@pytest.mark.fuzz
def test_any_database_value_or_url_is_a_defined_exit_and_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths land here: none of them exists
    # seff-gpu asks squeue and sacct about a job it cannot find: not what is fuzzed here, and a Slurm
    # controller that does not answer would make each case wait for it
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))
    cfg = tmp_path / "g.toml"
    count = 0

    @FUZZ
    @given(VALUE, st.sampled_from(["db", "seff"]))
    def case(value: str, command: str) -> None:
        nonlocal count
        count += 1
        cfg.write_text(f'[paths]\ndatabase = {toml_string(value)}\nspool_dir = "{tmp_path}/spool"\n'
                       f'state_dir = "{tmp_path}/run"\n', encoding="utf-8", errors="surrogatepass")
        if command == "db":
            outcome(capsys, gpueff.main(["--config", str(cfg), "db", "current"]), "gpueff")
        else:
            outcome(capsys, seff.main(["--config", str(cfg), "123"]), "seff-gpu")

    case()
    assert count >= CASES
    assert sorted(os.listdir(tmp_path)) == ["g.toml"]  # nothing was created by reading


@pytest.fixture(scope="module")
def small_db(tmp_path_factory) -> bytes:
    return real_database(tmp_path_factory.mktemp("small"), n=2).read_bytes()


def damaged_files(original: bytes) -> st.SearchStrategy[bytes]:
    size = len(original)

    def flips(spots: list[tuple[int, int]]) -> bytes:
        data = bytearray(original)
        for offset, bit in spots:
            data[offset % size] ^= 1 << bit
        return bytes(data)

    def page(n: int, seed: int) -> bytes:
        data = bytearray(original)
        at = (n * 4096) % size
        data[at:at + 4096] = random.Random(seed).randbytes(4096)
        return bytes(data[:size])

    return st.one_of(
        st.binary(max_size=4096),
        st.integers(0, size).map(lambda n: original[:n]),
        st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 7)), min_size=1, max_size=8).map(flips),
        st.tuples(st.integers(0, size // 4096), st.integers()).map(lambda t: page(*t)),
        st.binary(min_size=1, max_size=64).map(lambda b: original[:100] + b),  # a header, then garbage
    )


def main_with(parser):
    """``gpueff.main`` with its parser built once: building it is most of a case's time, and not fuzzed."""
    def main(argv: list[str]) -> int:
        args = parser.parse_args(argv)
        args.config = getattr(args, "config", None)
        return run_command("gpueff", args.run, args)
    return main


@pytest.mark.fuzz
def test_any_database_file_is_a_defined_exit_and_one_line(small_db, tmp_path, capsys, monkeypatch):
    """Random bytes, truncations, bit flips and overwritten pages of a real small database, as the file of
    ``gpueff db current``, ``gpueff doctor --json`` (its database checks only: the node's probes are not
    what is fuzzed) and ``gpueff ingest`` (an empty spool: the schema is checked and upgraded)."""
    monkeypatch.setattr(doctor, "CHECKS", (("database", doctor.check_db),))
    gc.collect()  # what earlier tests left (thousands of engines) would otherwise slow every collection here
    gc.freeze()
    db = tmp_path / "db" / "gpueff.db"
    db.parent.mkdir(mode=0o700)
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[paths]\ndatabase = "{db}"\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/run"\n')
    migrate.head()
    main = main_with(gpueff.build_parser())
    count = 0
    seen: dict[tuple[str, int], int] = {}

    @FUZZ
    @given(damaged_files(small_db), st.sampled_from(["db", "doctor", "ingest"]))
    def case(data: bytes, command: str) -> None:
        nonlocal count
        count += 1
        for side in ("-wal", "-shm", "-journal"):
            Path(f"{db}{side}").unlink(missing_ok=True)
        db.write_bytes(data)
        db.chmod(0o600)
        if command == "db":
            code = main(["--config", str(cfg), "db", "current"])
            outcome(capsys, code, "gpueff")
        elif command == "doctor":
            code = main(["--config", str(cfg), "doctor", "--json"])
            out, err = capsys.readouterr()  # doctor's findings are its report, on stdout
            report = json.loads(out)
            assert err == "" and code == (1 if report["failures"] else 0), (err, out)
        else:
            code = main(["--config", str(cfg), "ingest", "--quiet"])
            outcome(capsys, code, "gpueff")
        seen[command, code] = seen.get((command, code), 0) + 1

    try:
        case()
    finally:
        gc.unfreeze()
    assert count >= CASES
    # both outcomes were met: intact enough to read, and refused
    assert seen.get(("db", 0)) and seen.get(("db", 1)) and seen.get(("doctor", 1)), seen
