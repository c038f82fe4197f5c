#!/usr/bin/env bash
# The whole test suite as CI runs it (README: the test command; .ci/run), after `bash tests/setup-services.sh`:
# two groups at once, each printing its 25 slowest tests, then one pytest-style summary of both. Exit 0 only if
# both groups pass. Extra arguments go to both pytest runs (e.g. --hypothesis-profile=deep).
#
# The Slurm group (real slurmctld/slurmd/slurmdbd of all three versions, one after another: MariaDB on 3307+,
# ports 6817-6819, /run/munge, /dev/nvidiaN, user alice) runs in the background, mostly waiting on its daemons,
# while everything else runs in the foreground on two pytest-xdist workers (private munged/PostgreSQL/SMTP on
# free ports, user gpuser, fake /dev dirs under tmp, a temp dir per test): they share nothing.
# Hypothesis profile "ci" (tests/conftest.py): about 1,000 reproducible cases per fuzz test.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
logs=$(mktemp -d)
echo "== tests: -m slurm in the background (log: $logs/slurm.log), -m \"not slurm\" here on 2 workers"
"$py" -m pytest -m slurm --durations=25 "$@" > "$logs/slurm.log" 2>&1 &
slurm_pid=$!
"$py" -m pytest -m "not slurm" -n 2 --durations=25 "$@" 2>&1 | tee "$logs/rest.log"
rest_rc=${PIPESTATUS[0]}
wait "$slurm_pid"
slurm_rc=$?
echo "== tests: the Slurm group (pytest -m slurm, run beside the above; exit $slurm_rc)"
cat "$logs/slurm.log"
# Last, one pytest-style summary of both groups (a CI reader looks at the closing lines).
"$py" - "$logs/rest.log" "$logs/slurm.log" "$rest_rc" "$slurm_rc" <<'PY'
import re, sys
counts, secs = {}, 0.0
for log in sys.argv[1:3]:
    tail = [line for line in open(log, errors="replace") if re.search(r" in [0-9.]+s", line)]
    last = tail[-1] if tail else "no summary: 1 error in 0s"
    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|warnings?)", last):
        kind = {"error": "errors", "warning": "warnings"}.get(kind, kind)
        counts[kind] = counts.get(kind, 0) + int(n)
    secs = max(secs, float(re.search(r" in ([0-9.]+)s", last).group(1)) if " in " in last else 0.0)
rc = 0 if sys.argv[3] == sys.argv[4] == "0" else 1
if rc and not (counts.get("failed") or counts.get("errors")):
    counts["errors"] = 1  # a group that failed without a failing test (collection, crash)
order = ["failed", "passed", "skipped", "xfailed", "xpassed", "warnings", "errors"]
text = ", ".join(f"{counts[k]} {k[:-1] if counts[k] == 1 and k in ('warnings', 'errors') else k}"
                 for k in order if counts.get(k))
print("== tests: both groups together (not slurm + slurm, run in parallel; the time is the longer group's)")
print(f"{'=' * 20} {text} in {secs:.2f}s {'=' * 20}")
sys.exit(rc)
PY
