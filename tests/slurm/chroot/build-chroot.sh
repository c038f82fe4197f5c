#!/bin/bash
# build-chroot.sh SUITE [CHROOT] - a Debian SUITE chroot with Slurm, munge and MariaDB from Debian's own packages,
# for the slurm tests' newer Slurm generations: trixie = Slurm 24.11, sid = Slurm 26.05 (on a Debian 12 host).
#   CHROOT: default /srv/slurm-SUITE. Does nothing if it already holds slurmctld. Builds aside and renames, so a
#   failed build leaves no half chroot. Needs root, mmdebstrap (installed here if missing) and a Debian mirror:
#   MIRROR, else the one this host's apt uses. About 620 MB; 25-80 s depending on the mirror and the machine.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SUITE=${1:?usage: $0 trixie|sid [CHROOT]}
CH=${2:-${CHROOT:-/srv/slurm-$SUITE}}
PKGS=munge,slurmctld,slurmd,slurmdbd,slurm-client,slurm-wlm-basic-plugins,slurm-wlm-mysql-plugin,mariadb-server
PKGS=$PKGS,iproute2,procps,python3    # python3: the project's hooks run under the chroot's slurmd
PKGS=$PKGS,python3-venv,ca-certificates  # the site test installs the package into a venv there, as on a GPU node
if [ -x "$CH/usr/sbin/slurmctld" ]; then  # built: add what a newer recipe asks for, if an older build lacks it
  if ! chroot "$CH" dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q 'ok installed'; then
    chroot "$CH" apt-get update -qq -o Acquire::Check-Valid-Until=false
    chroot "$CH" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3-venv ca-certificates >/dev/null
  fi
  exit 0
fi
host_mirror() { # the Debian mirror this host's apt already uses (deb822 sources, else sources.list)
  awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1 | grep . ||
    awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null
}
MIRROR=${MIRROR:-$(host_mirror)}
[ -n "$MIRROR" ] || { echo "no Debian mirror found in /etc/apt; set MIRROR" >&2; exit 2; }
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
t0=$(date +%s.%N)
rm -rf "$CH.tmp"
mkdir -p "$(dirname "$CH")"
# Check-Valid-Until=false: a frozen snapshot mirror serves a sid InRelease past its 7-day validity
mmdebstrap --quiet --variant=minbase --aptopt='APT::Install-Recommends "false"' \
  --aptopt='Acquire::Check-Valid-Until "false"' --include="$PKGS" "$SUITE" "$CH.tmp" "$MIRROR"
mv "$CH.tmp" "$CH"
echo "built $CH ($SUITE, slurm $(chroot "$CH" dpkg-query -W -f='${Version}' slurmctld), $(du -sm "$CH" | cut -f1) MB)" \
  "in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.1f", a-b}') s"
