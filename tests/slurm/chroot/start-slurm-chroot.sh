#!/bin/bash
# start-slurm-chroot.sh SUITE - a newer Debian Slurm in a chroot on a Debian 12 host (root, no systemd), for
# slurm-gpueff's slurm tests: SUITE trixie = Slurm 24.11, sid = Slurm 26.05. Builds /srv/slurm-SUITE
# (build-chroot.sh) if missing, then starts munged + a private MariaDB + slurmdbd + slurmctld + slurmd with
# NGPUS fake GPUs inside it. The same cluster shape and slurm.conf as ../start-slurm.sh (the host's 22.05),
# plus what 24.11+ needs here (see README.md). Idempotent: starts only what is not running.
# Everything it starts is recorded by PID file under $BASE/run; stop-slurm-chroot.sh stops exactly those and
# undoes the mounts listed in $BASE/run/mounts.
#
# BASE (required) is bind-mounted at the SAME path inside the chroot: config, spool, state, logs, pid files and
# job output are read on the host where the chroot's daemons and hooks wrote them.
# Env: BASE, PROLOG, EPILOG (required; host paths: the hooks run INSIDE the chroot, so their interpreter must
#        exist there: /usr/bin/python3 is installed), RO_MOUNTS (host directories bind-mounted read-only at the
#        same path, e.g. the checkout the hooks import from; the hooks' own directories are added, unless
#        HOOKS_IN_CHROOT=1: the hooks are installed inside the chroot, as on a real GPU node),
#      CHROOT (/srv/slurm-SUITE), NGPUS (4), NNODES (1; nodes HOST-2.. are extra slurmds, slurmd -N, in the same
#        chroot: het jobs need 2), NODE_CPUS (8), GPU_TYPE (simh100), CLUSTER (gpueffci), ACCOUNT (research),
#      TEST_USERS (alice: created on the host too, with the host's uid/gid inside), PORT_BASE (trixie 6917,
#        sid 7017: slurmctld P, slurmd P+1, slurmdbd P+2, node k>=2 P+1+k), MYSQL_PORT (trixie 3317, sid 3327;
#        the next free one is taken), MIRROR (for the build).
# Clients: $BASE/bin/{sbatch,sacct,scontrol,...} run the chroot's own (the host's 22.05 clients cannot talk
# to 24.11+ daemons): root enters the chroot directly, other users through a user namespace that maps only
# themselves (unshare --map-current-user), so munge vouches for their real uid.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=${1:?usage: $0 trixie|sid}
case $SUITE in
  trixie) DEF_PORT=6917 DEF_MY=3317 ;;
  sid)    DEF_PORT=7017 DEF_MY=3327 ;;
  *) echo "unknown suite $SUITE (trixie|sid)" >&2; exit 2 ;;
esac
: "${BASE:?BASE must name the test cluster directory}"
: "${PROLOG:?PROLOG must name the Prolog}"
: "${EPILOG:?EPILOG must name the Epilog}"
CH=${CHROOT:-/srv/slurm-$SUITE}
NGPUS=${NGPUS:-4}
SHARDS=${SHARDS:-0}
NNODES=${NNODES:-1}
NODE_CPUS=${NODE_CPUS:-8}
GPU_TYPE=${GPU_TYPE:-simh100}
PORT=${PORT_BASE:-$DEF_PORT}
MYSQL_PORT=${MYSQL_PORT:-$DEF_MY}
CLUSTER=${CLUSTER:-gpueffci}
ACCOUNT=${ACCOUNT:-research}
TEST_USERS=${TEST_USERS:-alice}
H=$(hostname -s)
DBPASS=slurmpw
MY=$BASE/mysql

T0=$(date +%s.%N)
ts() { printf '[start-%s %6.2fs] %s\n' "$SUITE" "$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{print a-b}')" "$*"; }
in_ch() { env -i PATH="$PATH" LANG=C.UTF-8 HOME=/root chroot "$CH" "$@"; }   # clean env: no host vars leak in
ours() { # ours <pidfile>: the pid is alive AND runs inside this chroot (never touch host daemons)
  [ -s "$1" ] && [ "$(readlink "/proc/$(cat "$1")/root" 2>/dev/null)" = "$CH" ]
}
alive() { # alive <pid>: exists and is not a zombie (a sandbox's PID 1 may reap orphans only every ~1.5 s)
  local st; st=$(sed -n 's/.*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null); [ -n "$st" ] && [ "$st" != Z ]
}
wait_for() { # wait_for <secs> <cmd...>
  local n=$(($1 * 10)); shift
  for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "TIMEOUT waiting for: $*" >&2; return 1
}
need_port() { # refuse to start a daemon whose port someone else holds
  if ss -Hltn "( sport = :$1 )" | grep -q .; then
    echo "port $1 ($2) is in use by another process; set PORT_BASE" >&2; ss -Hltnp "( sport = :$1 )" >&2; exit 1
  fi
}
[ "$(id -u)" = 0 ] || { echo "start-slurm-chroot.sh must run as root (chroot, mount, mknod)" >&2; exit 1; }

# ---------------------------------------------------------------- 1. chroot (built once)
if [ ! -x "$CH/usr/sbin/slurmctld" ]; then ts "building $CH"; "$HERE/build-chroot.sh" "$SUITE" "$CH"; fi
CH=$(readlink -f "$CH")
ts "chroot $CH: slurm $(in_ch dpkg-query -W -f='${Version}' slurmctld)"

# ---------------------------------------------------------------- 2. mounts (recorded for stop-slurm-chroot.sh)
mkdir -p "$BASE"/{bin,log,run,state/ctld}
MOUNTS=$BASE/run/mounts
mnt() { # mnt <target> <mount args...>: mount unless already mounted, remember it
  local t=$1; shift
  mountpoint -q "$t" && return 0
  mkdir -p "$t"; mount "$@" "$t"; echo "$t" >> "$MOUNTS"
}
mnt "$CH/proc" -t proc proc
mnt "$CH/sys" --bind /sys              # non-recursive: the host's cgroup mounts stay invisible
mnt "$CH/dev/pts" --bind /dev/pts
mnt "$CH/dev/shm" -t tmpfs -o mode=1777 tmpfs
# /dev is the chroot's own on-disk /dev: the fake GPUs go there, the host's /dev/nvidia* are not touched.
hook_dirs() { [ "${HOOKS_IN_CHROOT:-0}" = 1 ] || for h in "$PROLOG" "$EPILOG"; do dirname "$(readlink -f "$h")"; done | sort -u; }
for d in ${RO_MOUNTS:-} $(hook_dirs); do
  d=$(readlink -f "$d")
  case "$d/" in "$BASE"/*) continue ;; esac   # inside BASE: visible through the BASE mount
  mountpoint -q "$CH$d" || { mnt "$CH$d" --bind "$d" && mount -o remount,bind,ro "$CH$d"; }
done
mnt "$CH$BASE" --bind "$BASE"

# ---------------------------------------------------------------- 3. hosts, users (host uids), GPUs, munge
grep -qw "$H" "$CH/etc/hosts" || echo "127.0.0.1 $H" >> "$CH/etc/hosts"
for u in $TEST_USERS; do   # the same uid/gid on both sides: the host's seff-gpu checks the chroot's records
  id "$u" >/dev/null 2>&1 || useradd -m "$u"
  uid=$(id -u "$u") gid=$(id -g "$u")
  if ! in_ch id "$u" >/dev/null 2>&1; then
    in_ch groupadd -g "$gid" "$u"; in_ch useradd -m -u "$uid" -g "$gid" "$u"
  elif [ "$(in_ch id -u "$u")" != "$uid" ] || [ "$(in_ch id -g "$u")" != "$gid" ]; then
    in_ch groupmod -g "$gid" "$u"; in_ch usermod -u "$uid" -g "$gid" "$u"
  fi
done
for ((i = 0; i < NGPUS; i++)); do          # gres/gpu needs real character devices
  [ -c "$CH/dev/nvidia$i" ] || { rm -f "$CH/dev/nvidia$i"; mknod "$CH/dev/nvidia$i" c 195 "$i"; }
done
[ -s "$CH/etc/munge/munge.key" ] || in_ch mungekey --create --keyfile=/etc/munge/munge.key
in_ch sh -c 'mkdir -p /run/munge && chown munge:munge /run/munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key'
if ! ours "$CH/run/munge/munged.pid"; then
  rm -f "$CH"/run/munge/munge.socket.2*
  in_ch runuser -u munge -- /usr/sbin/munged
fi
wait_for 10 in_ch sh -c 'munge -n | unmunge'
ts "munged up (pid $(cat "$CH/run/munge/munged.pid"))"

# ---------------------------------------------------------------- 4. client wrappers + config
for c in sacct sacctmgr sbatch scancel scontrol sinfo squeue srun; do
  cat > "$BASE/bin/$c" <<EOC
#!/bin/sh
# $c of the Slurm in $CH, with the caller's arguments, environment and (where the chroot has it) directory
wd=/; [ -d "$CH\$PWD" ] && wd=\$PWD
[ "\$(id -u)" = 0 ] && exec unshare --root="$CH" --wd="\$wd" /usr/bin/$c "\$@"
exec unshare --map-current-user --root="$CH" --wd="\$wd" /usr/bin/$c "\$@"
EOC
done
chmod 755 "$BASE"/bin/*
ETC=$CH/etc/slurm
NODES="$H"; for ((k = 2; k <= NNODES; k++)); do NODES="$NODES $H-$k"; done
cat > "$ETC/slurm.conf.new" <<EOF
# generated by slurm-gpueff tests/slurm/chroot/start-slurm-chroot.sh $SUITE for $BASE
ClusterName=$CLUSTER
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
StateSaveLocation=$BASE/state/ctld
SlurmdSpoolDir=$BASE/state/d-%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
MinJobAge=600
# --- slurm-gpueff (etc/slurm.conf.snippet)
Prolog=$PROLOG
Epilog=$EPILOG
PrologFlags=Alloc
PrologEpilogTimeout=60
# ---
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$H
AccountingStoragePort=$((PORT + 2))
AccountingStorageTRES=gres/gpu,gres/gpu:$GPU_TYPE$([ "$SHARDS" -gt 0 ] && echo ",gres/shard")
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
GresTypes=gpu$([ "$SHARDS" -gt 0 ] && echo ",shard")
NodeName=DEFAULT CPUs=$NODE_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$NODE_CPUS ThreadsPerCore=1 RealMemory=1000 Gres=gpu:$GPU_TYPE:$NGPUS$([ "$SHARDS" -gt 0 ] && echo ",shard:$((NGPUS * SHARDS))") State=UNKNOWN
NodeName=$H
$(for ((k = 2; k <= NNODES; k++)); do echo "NodeName=$H-$k NodeAddr=127.0.0.1 Port=$((PORT + 1 + k))"; done)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
conf_changed=0
cmp -s "$ETC/slurm.conf.new" "$ETC/slurm.conf" || conf_changed=1
mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"
echo "Name=gpu Type=$GPU_TYPE File=/dev/nvidia[0-$((NGPUS - 1))]" > "$ETC/gres.conf"
# gres/shard: SHARDS per GPU, the same device files (a GPU's shards and the whole GPU are never given at once)
[ "$SHARDS" -gt 0 ] && echo "Name=shard Count=$((NGPUS * SHARDS)) File=/dev/nvidia[0-$((NGPUS - 1))]" >> "$ETC/gres.conf"
# 24.11+ slurmd always initialises a cgroup plugin; in the chroot /sys/fs/cgroup is empty -> disable it
echo "CgroupPlugin=disabled" > "$ETC/cgroup.conf"
chmod 644 "$ETC/slurm.conf" "$ETC/gres.conf" "$ETC/cgroup.conf"
cat > "$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$H
DbdPort=$((PORT + 2))
SlurmUser=root
DebugLevel=info
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=@MYSQL_PORT@
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
EOF
chmod 600 "$ETC/slurmdbd.conf"             # slurmdbd refuses a readable file
ts "config written ($ETC, ports ctld=$PORT slurmd=$((PORT + 1)) dbd=$((PORT + 2)))"

# ---------------------------------------------------------------- 5. MariaDB (private datadir) + slurmdbd
mkdir -p "$MY"; in_ch chown mysql:mysql "$MY"
[ -d "$MY/data/mysql" ] || in_ch mariadb-install-db --no-defaults --user=mysql --datadir="$MY/data" \
  --auth-root-authentication-method=socket --skip-test-db > "$BASE/log/mariadb-install.log" 2>&1
if ours "$MY/mariadbd.pid" && [ -s "$MY/port" ]; then
  MYSQL_PORT=$(cat "$MY/port")
else
  while ss -Htan "( sport = :$MYSQL_PORT )" | grep -q .; do MYSQL_PORT=$((MYSQL_PORT + 1)); done
  echo "$MYSQL_PORT" > "$MY/port"
  in_ch start-stop-daemon --start --background --pidfile "$MY/mariadbd.pid" --exec /usr/sbin/mariadbd -- \
    --no-defaults --user=mysql --datadir="$MY/data" --socket="$MY/mysqld.sock" --pid-file="$MY/mariadbd.pid" \
    --bind-address=127.0.0.1 --port="$MYSQL_PORT" --log-error="$MY/mariadbd.log" \
    --innodb-buffer-pool-size=128M --innodb-log-file-size=48M --innodb-lock-wait-timeout=900 \
    --skip-name-resolve \
    --innodb-snapshot-isolation=OFF      # MariaDB 11.8 default ON; slurmdbd 26.05 warns it can fatal on conflicts
fi
wait_for 60 in_ch mariadb-admin --socket="$MY/mysqld.sock" ping || {
  tail -n 20 "$BASE/log/mariadb-install.log" "$MY/mariadbd.log" >&2; exit 1; }
in_ch mariadb --socket="$MY/mysqld.sock" <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
sed -i "s/^StoragePort=.*/StoragePort=$MYSQL_PORT/" "$ETC/slurmdbd.conf"
ts "mariadbd up (pid $(cat "$MY/mariadbd.pid"), port $MYSQL_PORT)"
if ! ours "$BASE/run/slurmdbd.pid"; then need_port $((PORT + 2)) slurmdbd; in_ch slurmdbd; fi
wait_for 60 in_ch sacctmgr -n -P list cluster format=cluster
ts "slurmdbd up (pid $(cat "$BASE/run/slurmdbd.pid"))"
in_ch sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || in_ch sacctmgr -i add cluster "$CLUSTER" >/dev/null
in_ch sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT" ||
  in_ch sacctmgr -i add account "$ACCOUNT" Description=test Organization=test >/dev/null
for u in root $TEST_USERS; do
  in_ch sacctmgr -n -P list assoc where cluster="$CLUSTER" account="$ACCOUNT" user="$u" format=user | grep -qx "$u" ||
    in_ch sacctmgr -i add user "$u" Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null
done
ts "accounting: cluster=$CLUSTER account=$ACCOUNT users=root $TEST_USERS"

# ---------------------------------------------------------------- 6. slurmctld + slurmd
for pf in "$BASE"/run/slurmd-*.pid "$BASE/run/slurmctld.pid"; do  # changed slurm.conf -> restart (reconfigure cannot switch plugins)
  if [ $conf_changed = 1 ] && ours "$pf"; then
    pid=$(cat "$pf"); ts "slurm.conf changed: restarting $(basename "$pf" .pid) (pid $pid)"
    kill "$pid"; wait_for 30 eval "! alive $pid"
  fi
done
if ! ours "$BASE/run/slurmctld.pid"; then need_port "$PORT" slurmctld; in_ch slurmctld -i; fi
wait_for 30 in_ch scontrol ping
k=1
for n in $NODES; do                      # extra nodes: same chroot, own name (-N), spool, pid file and port
  mkdir -p "$BASE/state/d-$n"            # slurmd does not create its spool dir (hwloc/socket errors otherwise)
  if ! ours "$BASE/run/slurmd-$n.pid"; then need_port $((PORT + (k > 1 ? 1 + k : 1))) "slurmd $n"; in_ch slurmd -N "$n"; fi
  k=$((k + 1))
done
node_ok() {
  local st; st=$(in_ch sinfo -h -N -n "$1" -o %T 2>/dev/null)
  case "$st" in
    idle|mixed|allocated|completing) return 0 ;;
    drain*|down*|inval*) in_ch scontrol update nodename="$1" state=resume >/dev/null 2>&1; return 1 ;;
    *) return 1 ;;
  esac
}
for n in $NODES; do wait_for 60 node_ok "$n"; done
ts "slurmctld (pid $(cat "$BASE/run/slurmctld.pid")) + slurmd ($(for n in $NODES; do printf '%s ' "$(cat "$BASE/run/slurmd-$n.pid")"; done)) up; node: $(in_ch sinfo -h -N -o '%N %T %G' | tr '\n' ' ')"
