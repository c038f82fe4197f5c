#!/usr/bin/env bash
# Installs and starts the real services the test suite talks to; idempotent, needs root (Debian 12).
# Used by .ci/run and by the README's test command:  bash tests/setup-services.sh && .venv/bin/python -m pytest
set -euo pipefail
# --- reports: Debian's headless Chromium for the `browser` tests, DejaVu fonts for it and for
# the matplotlib charts. (The `smtp` tests need no system package: aiosmtpd is in the `test` extra.)
echo "== users: gpuser (the ordinary user the privacy tests run seff-gpu as)"
id gpuser >/dev/null 2>&1 || useradd -m gpuser
echo "== reports: chromium"
if ! command -v chromium >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
# --- end reports
# --- service: PostgreSQL for the `postgres` tests. They create and drop their own databases
# on the server at 127.0.0.1:5432 (trust auth for local TCP), and start private clusters with
# /usr/lib/postgresql/*/bin/{initdb,pg_ctl} as the postgres user for the DB-down tests.
# --- ingest durability: strace watches (and fails, by fault injection) the fsyncs of a real ingest.
echo "== ingest: strace"
if ! command -v strace >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends strace >/dev/null
fi
# --- end ingest
# --- serve's schedule: libfaketime steps a real `gpueff serve`'s wall clock (only it: the monotonic clock stays).
echo "== serve: libfaketime"
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libfaketime >/dev/null
fi
# --- end serve
echo "== service: postgresql"
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
pgver=$(ls /etc/postgresql | sort -V | tail -1)
hba=/etc/postgresql/$pgver/main/pg_hba.conf
grep -q "gpueff-ci" "$hba" || sed -i '1i host all all 127.0.0.1/32 trust # gpueff-ci' "$hba"
if pg_isready -q -h 127.0.0.1 -p 5432; then
  pg_ctlcluster --skip-systemctl-redirect "$pgver" main reload
else
  pg_ctlcluster --skip-systemctl-redirect "$pgver" main start
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
# --- end service
# --- slurm: Debian's Slurm 22.05, munge and MariaDB for the `slurm` tests. The harness
# (tests/slurm/start-slurm.sh, started by tests/slurm/conftest.py) installs them itself when missing; doing
# it here keeps apt out of the test timing. It then runs everything privately and stops it by PID: MariaDB
# with its own datadir under a temp dir on 127.0.0.1:3307 or the next free port (a system MariaDB may hold
# 3306), slurmdbd, slurmctld, slurmd, fake /dev/nvidiaN (removed again), user `alice`. Needs root.
echo "== slurm: packages"
slurm_pkgs=""
for p in iproute2 munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins slurmdbd slurm-wlm-mysql-plugin \
         mariadb-server; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || slurm_pkgs="$slurm_pkgs $p"
done
if [ -n "$slurm_pkgs" ]; then
  policy_tmp=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then  # keep the packages' postinst from starting system daemons
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; policy_tmp=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $slurm_pkgs >/dev/null
  if [ $policy_tmp = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
# Slurm 24.11 and 26.05 run in Debian trixie and sid chroots built from Debian's packages with mmdebstrap
# (tests/slurm/chroot/README.md; /srv/slurm-SUITE, ~620 MB each; kept when present). The harness builds a
# missing one itself; building here keeps the build out of the test timing.
echo "== slurm: chroots for 24.11 (trixie) and 26.05 (sid)"
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
for suite in trixie sid; do bash "$(dirname "$0")/slurm/chroot/build-chroot.sh" "$suite"; done
# --- end slurm
