#!/usr/bin/env python3
"""Stand-in for Slurm's ``sacct`` and ``sacctmgr`` (no slurmdbd runs for the unit tests): answers from
real captured output (tests/data/slurmcmds/), as the real command would for the arguments it gets.

Installed as ``<dir>/sacct`` / ``<dir>/sacctmgr`` (a copy of this file, run as a real process). Every call
is appended to ``$FAKE_SLURM_LOG`` (one JSON list of argv per line). ``$FAKE_SLURM_MODE``: ``fail`` (exit 1
with slurmdbd's connection error), ``slow`` (sleeps 60 s), ``pending`` (sacct: an array still pending,
so only its own record ``2_[0-2]`` exists), ``accounting-none`` (a site without slurmdbd);
``$FAKE_SACCTMGR_FILE``: the sacctmgr output to print; ``$FAKE_SLURM_SLEEP_S``: seconds every call takes
first (a slurmdbd slow to answer);
``$FAKE_SLURM_DATA``: tests/data/slurmcmds (where a copy elsewhere finds the captures).
"""

import json
import os
import sys
import time

DATA = os.environ.get("FAKE_SLURM_DATA") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                                        "slurmcmds")
FIELDS = ("JobIDRaw", "JobID", "Cluster", "User", "UID", "Account", "Partition", "QOS", "NodeList", "AllocTRES",
          "Submit", "Start", "End", "ElapsedRaw", "State", "ExitCode", "JobName")


def main(argv: list[str]) -> int:
    name = os.path.basename(sys.argv[0])
    if os.environ.get("FAKE_SLURM_LOG"):
        with open(os.environ["FAKE_SLURM_LOG"], "a") as fh:
            fh.write(json.dumps([name, *argv]) + "\n")
    mode = os.environ.get("FAKE_SLURM_MODE", "")
    time.sleep(float(os.environ.get("FAKE_SLURM_SLEEP_S") or 0))
    if mode == "slow":
        time.sleep(60)
    if mode == "fail":
        print(f"{name}: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
              "host:dbd:6819: Connection refused", file=sys.stderr)
        return 1
    if name == "sacctmgr":
        with open(os.environ["FAKE_SACCTMGR_FILE"]) as fh:
            sys.stdout.write(fh.read())
        return 0
    spec = argv[argv.index("-j") + 1]
    fields = argv[argv.index("-o") + 1].split(",")
    delim = next((a.split("=", 1)[1] for a in argv if a.startswith("--delimiter=")), "|")
    with open(os.path.join(DATA, "sacct-product-P-24.11.5.psv")) as fh:
        rows = [dict(zip(FIELDS, line.rstrip("\n").split("|"), strict=True)) for line in fh if line.strip()]
    if mode == "accounting-none":  # a site without slurmdbd
        print(f"{name}: fatal: Slurm accounting storage is disabled", file=sys.stderr)
        return 1
    if mode == "pending":
        rows = [dict(rows[0], JobIDRaw="2", JobID="2_[0-2]", State="PENDING")]
        hits = [r for r in rows if spec.startswith("2_")]
    else:
        # as sacct -j: a raw id or JobID names that job; an array's or het job's own id every task / component
        hits = [r for r in rows
                if spec in (r["JobID"], r["JobIDRaw"]) or r["JobID"].startswith((f"{spec}_", f"{spec}+"))]
    for r in hits:
        print(delim.join(r[f] for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
