#!/bin/bash
# stop-slurm-chroot.sh SUITE [--purge] - stop what start-slurm-chroot.sh started, by PID file, and undo its mounts.
#   Only pids whose root directory is the chroot are signalled (a host daemon with a reused pid is never hit).
#   --purge: also delete BASE's Slurm state, MariaDB data, logs and pid files. The chroot itself is kept.
# Env: BASE (required), CHROOT (default /srv/slurm-SUITE).
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SUITE=${1:?usage: $0 trixie|sid [--purge]}
: "${BASE:?BASE must name the test cluster directory}"
CH=$(readlink -f "${CHROOT:-/srv/slurm-$SUITE}")
PURGE=0; [ "${2:-}" = "--purge" ] && PURGE=1
in_ch() { env -i PATH="$PATH" LANG=C.UTF-8 HOME=/root chroot "$CH" "$@"; }
ours() { [ -s "$1" ] && [ "$(readlink "/proc/$(cat "$1")/root" 2>/dev/null)" = "$CH" ]; }
alive() { # alive <pid>: exists and is not a zombie (a sandbox's PID 1 may reap orphans only every ~1.5 s)
  local st; st=$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null); [ -n "$st" ] && [ "$st" != Z ]
}
stop_pid() { # stop_pid <name> <pid>: TERM, wait up to 30 s, then KILL
  local name=$1 pid=$2 t0; t0=$(date +%s%N)
  kill -CONT "$pid" 2>/dev/null        # a test may have stopped it (SIGSTOP) to make it slow
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < 600; i++)); do alive "$pid" || break; sleep 0.05; done
  alive "$pid" && { echo "$name: pid $pid ignored SIGTERM, SIGKILL"; kill -KILL "$pid"; }
  echo "$name: stopped pid $pid ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
}
stop_pidfile() { # stop_pidfile <name> <pidfile>
  if ours "$2"; then stop_pid "$1" "$(cat "$2")"; else echo "$1: not running"; fi
  rm -f "$2"
}

# cancel remaining jobs so no slurmstepd outlives slurmd
if ours "$BASE/run/slurmctld.pid"; then
  jobs=$(in_ch squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    echo "cancelling jobs: $jobs"; in_ch scancel $jobs 2>/dev/null
    for ((i = 0; i < 150; i++)); do [ -z "$(in_ch squeue -h -t R,CG -o %A 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi
for pf in "$BASE"/run/slurmd-*.pid; do [ -e "$pf" ] && stop_pidfile "$(basename "$pf" .pid)" "$pf"; done
stop_pidfile slurmctld "$BASE/run/slurmctld.pid"
stop_pidfile slurmdbd  "$BASE/run/slurmdbd.pid"
stop_pidfile mariadbd  "$BASE/mysql/mariadbd.pid"
stop_pidfile munged   "$CH/run/munge/munged.pid"

# leftovers in the chroot: a stray slurmstepd or job process (SLURM_JOB_ID in its environment) came from our
# daemons and is stopped; anything else (someone's `chroot ... bash`) is only reported
for p in /proc/[0-9]*; do
  [ "$(readlink "$p/root" 2>/dev/null)" = "$CH" ] || continue
  what="$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null | cut -c1-60)"
  if [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -q '^SLURM_JOB_ID='; then
    stop_pid "leftover $what" "${p#/proc/}"
  else
    echo "note: pid ${p#/proc/} ($what) runs in $CH but was not started by us; left alone (mounts may stay busy)"
  fi
done

# undo our mounts, last first; mount points made for BASE and the read-only host directories go too
if [ -s "$BASE/run/mounts" ]; then
  tac "$BASE/run/mounts" | while read -r t; do
    mountpoint -q "$t" && { umount "$t" || umount -l "$t"; }
    case "$t" in "$CH/proc"|"$CH/sys"|"$CH/dev/"*) ;; *) rmdir "$t" 2>/dev/null ;; esac
  done
  echo "unmounted $(wc -l < "$BASE/run/mounts") mounts"
  rm -f "$BASE/run/mounts"
fi
if [ $PURGE = 1 ]; then
  rm -rf "$BASE/state" "$BASE/mysql" "$BASE/log" "$BASE/run"
  echo "purged $BASE/{state,mysql,log,run}"
fi
