#!/bin/bash
# stop-slurm.sh - stop what tests/slurm/start-slurm.sh started, by PID file only (never by name),
# and remove the /dev/nvidiaN nodes it created. Usage: BASE=... stop-slurm.sh [--purge]
#   --purge: also delete $BASE's Slurm state, MariaDB data and logs.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
: "${BASE:?BASE must name the test cluster directory}"
PURGE=0; [ "${1:-}" = "--purge" ] && PURGE=1

stop_pidfile() { # stop_pidfile <name> <pidfile>
  local name=$1 pf=$2 pid
  [ -s "$pf" ] || return 0
  pid=$(cat "$pf")
  if ! kill -0 "$pid" 2>/dev/null; then echo "$name: not running (stale pid $pid)"; rm -f "$pf"; return 0; fi
  kill -CONT "$pid" 2>/dev/null   # a test may have stopped it (SIGSTOP) to make it slow
  kill -TERM "$pid"
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "$name: pid $pid ignored SIGTERM for 30s, sending SIGKILL"; kill -KILL "$pid"; fi
  rm -f "$pf"
  echo "$name: stopped pid $pid"
}

# cancel remaining jobs so no slurmstepd outlives slurmd
if [ -s "$BASE/run/slurmctld.pid" ] && kill -0 "$(cat "$BASE/run/slurmctld.pid")" 2>/dev/null; then
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    echo "cancelling jobs: $jobs"; scancel $jobs
    for ((i = 0; i < 150; i++)); do [ -z "$(squeue -h -t R,CG -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

stop_pidfile slurmd    "$BASE/run/slurmd.pid"
stop_pidfile slurmctld "$BASE/run/slurmctld.pid"
stop_pidfile slurmdbd  "$BASE/run/slurmdbd.pid"
stop_pidfile mariadbd  "$BASE/mysql/mariadbd.pid"
stop_pidfile munged    "$BASE/run/munged.pid"      # only present when start-slurm.sh started munged

if [ -s "$BASE/run/created-devices" ]; then
  while read -r d; do [ -c "$d" ] && rm -f "$d"; done < "$BASE/run/created-devices"
  rm -f "$BASE/run/created-devices"
  echo "removed the fake GPU device nodes"
fi
if [ $PURGE = 1 ]; then
  rm -rf "$BASE/state" "$BASE/mysql" "$BASE/log" "$BASE/run"
  echo "purged $BASE/{state,mysql,log,run}"
fi
