#!/usr/bin/env bash
# A two-node SLURM test cluster on this one machine, for `pytest -m slurm` (tests/test_slurm.py)
# and for trying the launcher presets by hand. Needs root and apt (Debian/Ubuntu).
#
#   sudo scripts/slurm_cluster.sh start    # install slurm-wlm + munge if missing, start, wait for idle
#   sudo scripts/slurm_cluster.sh status   # daemons and sinfo
#   sudo scripts/slurm_cluster.sh stop     # kill the daemons by pid
#
# Nodes n1 and n2 are two slurmd's on 127.0.0.1 (ports 6821, 6822), each with all CPUs of the
# machine; partition `debug` oversubscribes them (FORCE:4) so that a 2-job sweep of 2 tasks fits
# on 2 cores. `start` is idempotent: daemons already running are left alone, and with SLURM
# installed it takes a few seconds. Exit status: 0 up, 1 could not start (the reason on stderr).
set -euo pipefail

ETC=/etc/slurm
CONF=$ETC/slurm.conf
STATE=/var/lib/slurm-test           # slurmctld state, slurmd spool dirs
LOGS=/var/log/slurm-test
RUN=/run/slurm-test                 # pid files
NODES=(n1 n2)

die() { echo "slurm_cluster: $*" >&2; exit 1; }

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
  command -v apt-get >/dev/null || die "no apt-get: install slurm-wlm and munge by hand"
  echo "slurm_cluster: installing slurm-wlm and munge with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed"
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null || die "apt-get install failed"
}

write_conf() {
  local mem_mb cpus
  cpus=$(nproc)
  mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)  # both nodes see all of it
  mkdir -p "$ETC" "$STATE/ctld" "$LOGS" "$RUN"
  cat >"$CONF.new" <<EOF
# Written by hvp-lightning scripts/slurm_cluster.sh: two slurmd nodes on one machine.
ClusterName=hvptest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
# The time-limit signal (sbatch --signal=USR2@N) and the kill: slurmctld checks limits about every
# 30 s; KillWait is the SIGTERM -> SIGKILL grace, so a handler has time to checkpoint.
KillWait=30
MinJobAge=300
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=n[1-2] NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=[6821-6822] CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  if [[ -f $CONF ]] && cmp -s "$CONF" "$CONF.new"; then rm "$CONF.new"; return 1; fi
  mv "$CONF.new" "$CONF"
  return 0  # changed: running daemons must restart
}

hosts() {  # Lightning takes MASTER_ADDR from the node list, so n1/n2 must resolve
  local n
  for n in "${NODES[@]}"; do
    grep -qE "^127\.0\.0\.1[[:space:]].*\b$n\b" /etc/hosts || echo "127.0.0.1 $n" >>/etc/hosts
  done
}

start_munge() {
  [[ -s /etc/munge/munge.key ]] || mungekey -c
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || die "munged did not start"
  fi
}

start_daemons() {
  local n
  pid_alive "$RUN/slurmctld.pid" || slurmctld || die "slurmctld did not start (see $LOGS/slurmctld.log)"
  for n in "${NODES[@]}"; do
    mkdir -p "$STATE/slurmd-$n"
    pid_alive "$RUN/slurmd-$n.pid" || slurmd -N "$n" || die "slurmd -N $n did not start (see $LOGS/slurmd-$n.log)"
  done
}

wait_idle() {
  local i states
  for i in $(seq 60); do
    states=$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null | sort -u || true)
    if [[ $(grep -cE '^n[12] (idle|mixed|allocated)' <<<"$states") -eq 2 ]]; then
      echo "slurm_cluster: up: $(tr '\n' ' ' <<<"$states")"
      return 0
    fi
    # a node left down (e.g. after a restart of this script) comes back on request
    grep -qE 'down|drain' <<<"$states" && scontrol update nodename=n[1-2] state=resume 2>/dev/null || true
    sleep 1
  done
  die "nodes not idle after 60 s: $states (see $LOGS/)"
}

stop() {
  local f
  for f in "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid"; do
    pid_alive "$f" && kill "$(cat "$f")" && echo "slurm_cluster: stopped $(basename "$f" .pid)"
  done
  [[ -s /run/munge/munged.pid ]] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null && echo "slurm_cluster: stopped munged"
  return 0
}

start() {
  [[ $(id -u) -eq 0 ]] || die "needs root (it installs packages and starts daemons as root)"
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null || install
  hosts
  if write_conf; then  # new or changed config: running daemons read it again from scratch
    for f in "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid"; do pid_alive "$f" && kill "$(cat "$f")" || true; done
    sleep 1
  fi
  start_munge
  start_daemons
  wait_idle
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) for f in "$RUN"/*.pid; do pid_alive "$f" && echo "$(basename "$f" .pid): pid $(cat "$f")"; done
          sinfo -N 2>/dev/null || die "slurmctld not answering" ;;
  *) die "usage: $0 [start|stop|status]" ;;
esac
