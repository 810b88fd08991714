#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for tests and CI (Debian/Ubuntu, root).
#
#   bash scripts/slurm-local.sh [start] [DIR]   # from nothing to an idle node; idempotent
#   bash scripts/slurm-local.sh stop [DIR]      # stop slurmd, slurmctld, munged
#   bash scripts/slurm-local.sh status [DIR]    # exit 0 when the node answers and is usable
#
# Installs munge, slurmd, slurmctld and slurm-client from the distribution when missing, then
# writes slurm.conf and gres.conf with ARENAFLOW_SLURM_GPUS (default 4) fake GPUs: character
# devices made with mknod (docs/notes.md#fake-gpus-for-gres: File-less GPUs are dropped,
# File=/dev/null is fatal), so `--gres=gpu:N` jobs get CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS
# and GPUs are counted. Starts
# munged as the munge user, then slurmctld, then slurmd, without systemd, and waits (at most
# ARENAFLOW_SLURM_TIMEOUT s, default 90) until the node is idle. A cold start (daemons not running)
# begins with an empty job state: nothing queued before it survives.
#
# Everything lives under DIR (default $ARENAFLOW_SLURM_DIR or /tmp/arenaflow-slurm): config,
# state, logs, pid files, the munge socket, the fake devices. Outside it: the packages' own
# files, the munge key in /etc/munge (created by the munge package; made here only if absent),
# and /etc/slurm/slurm.conf, a symlink to DIR/etc/slurm.conf so that sinfo/sbatch/squeue find
# the cluster without SLURM_CONF (never written over a real file; removed by `stop`).
#
# No slurmdbd: sacct does not work, so Snakemake's Slurm plugin must use
# `slurm-status-command: squeue` (tests/slurm/profile), which needs MinJobAge >= 3 x the plugin's
# init-seconds-before-status-checks: MinJobAge is 3600 s here.
set -euo pipefail

cmd=start
case "${1:-}" in start|stop|status) cmd=$1; shift ;; esac
DIR=${1:-${ARENAFLOW_SLURM_DIR:-/tmp/arenaflow-slurm}}
NGPU=${ARENAFLOW_SLURM_GPUS:-4}
TIMEOUT=${ARENAFLOW_SLURM_TIMEOUT:-90}
CTLD_PORT=${ARENAFLOW_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${ARENAFLOW_SLURMD_PORT:-6818}
CONF=$DIR/etc/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
SOCKET=$DIR/munge/munge.socket.2
NODE=$(hostname -s)
export SLURM_CONF=$CONF

log() { echo "slurm-local: $*" >&2; }
die() { log "$*"; exit 1; }

alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_state() { sinfo -h -N -n "$NODE" -o %t 2>/dev/null | head -1; }

stop_pidfile() {  # stop the daemon whose pid is in $1 (only that process), wait up to 15 s
  local pidfile=$1 name=$2 pid i
  alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then log "$name ($pid) ignored SIGTERM: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; fi
  rm -f "$pidfile"
  log "stopped $name ($pid)"
}

stop() {
  stop_pidfile "$DIR/run/slurmd.pid" slurmd
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  stop_pidfile "$DIR/run/munged.pid" munged
  if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then rm -f "$ETC_CONF"; fi
}

status() {
  alive "$DIR/run/munged.pid" && alive "$DIR/run/slurmctld.pid" && alive "$DIR/run/slurmd.pid" \
    || { log "not running (pid files in $DIR/run)"; return 1; }
  local s; s=$(node_state)
  case $s in
    idle|mix|mixed|alloc|allocated) log "node $NODE: $s"; return 0 ;;
    *) log "node $NODE: ${s:-no answer}"; return 1 ;;
  esac
}

install_packages() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "need root to install ${missing[*]}"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
}

munge_key() {
  local key=/etc/munge/munge.key
  if [[ ! -s $key ]]; then
    log "creating $key"
    install -d -o munge -g munge -m 0700 /etc/munge
    runuser -u munge -- mungekey --create --keyfile="$key"
  fi
  chown munge:munge "$key"; chmod 0600 "$key"
}

write_config() {
  local cpus mem conf_line
  # The node as slurmd sees it (CPUs, memory),
  conf_line=$(slurmd -C | head -1)
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$conf_line")
  mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$conf_line")
  # A test cluster over-commits the machine on purpose (SlurmdParameters=config_overrides): the
  # jobs of a test DAG are small and mostly wait, and memory is not enforced (no cgroups).
  cpus=${ARENAFLOW_SLURM_CPUS:-$((cpus * 4))}
  mem=${ARENAFLOW_SLURM_MEM_MB:-$((mem * 2))}
  mkdir -p "$DIR/etc" "$DIR/dev"
  local i files=()
  for ((i = 0; i < NGPU; i++)); do
    # a character device (the numbers of /dev/null): enough for slurmd to count and bind it
    [[ -c $DIR/dev/gpu$i ]] || mknod "$DIR/dev/gpu$i" c 1 3
    files+=("$DIR/dev/gpu$i")
  done
  cat >"$CONF.new" <<EOF
# Written by scripts/slurm-local.sh: a single-node test cluster, $NGPU fake GPUs, no slurmdbd.
ClusterName=arenaflow
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/state/slurmd
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no systemd, no cgroup delegation: track processes by parentage
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without it every job takes the whole node's memory (docs/notes.md#memory-per-job)
DefMemPerCPU=1000
# squeue must still show a finished job when Snakemake asks (>= 3 x init-seconds), and the
# tests read every job of a run back from scontrol afterwards
MinJobAge=3600
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=10
Waittime=0
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem Gres=gpu:$NGPU State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  {
    echo "# Written by scripts/slurm-local.sh: fake GPUs, character devices under $DIR/dev"
    for i in "${!files[@]}"; do echo "NodeName=$NODE Name=gpu File=${files[$i]}"; done
  } >"$DIR/etc/gres.conf.new"
}

install_config() {
  mv "$CONF.new" "$CONF"
  mv "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"
  # Clients (sinfo, sbatch, squeue, scontrol) read /etc/slurm/slurm.conf unless SLURM_CONF is set.
  mkdir -p /etc/slurm
  if [[ -e $ETC_CONF || -L $ETC_CONF ]] && ! [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
    log "$ETC_CONF exists and is not ours: left alone; clients need SLURM_CONF=$CONF"
  else
    ln -sfn "$CONF" "$ETC_CONF"
  fi
}

wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  local t0=$SECONDS
  until "$@"; do
    ((SECONDS - t0 < limit)) || return 1
    sleep 0.5
  done
  log "$what after $((SECONDS - t0)) s"
}

munge_ok() { munge -n -S "$SOCKET" 2>/dev/null | unmunge -S "$SOCKET" >/dev/null 2>&1; }
ctld_ok() { scontrol ping 2>/dev/null | grep -q "UP"; }
node_idle() { [[ $(node_state) == idle ]]; }

start() {
  local t0=$SECONDS
  [[ $(id -u) == 0 ]] || die "run as root (slurmd must be root)"
  install_packages
  if status 2>/dev/null; then
    write_config
    if cmp -s "$CONF.new" "$CONF" && cmp -s "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"; then
      rm -f "$CONF.new" "$DIR/etc/gres.conf.new"
      wait_until "$TIMEOUT" "node $NODE idle" node_idle || die "running, but node $NODE is $(node_state)"
      log "already up (SLURM_CONF=$CONF)"
      return 0
    fi
    log "configuration changed: restarting"
  fi
  stop >/dev/null 2>&1 || true  # a half-started or outdated cluster: start over from the pid files
  # A cold start forgets the last cluster's jobs: ones killed with the machine would otherwise be
  # recovered from the saved state and hold the node ('mix') long after their processes are gone.
  rm -rf "$DIR/state"
  mkdir -p "$DIR/run" "$DIR/log" "$DIR/state/slurmctld" "$DIR/state/slurmd" "$DIR/munge"
  chmod 0755 "$DIR" "$DIR/run" "$DIR/log"
  chown munge:munge "$DIR/munge"; chmod 0700 "$DIR/munge"
  munge_key
  write_config
  install_config

  touch "$DIR/log/munged.log" "$DIR/run/munged.pid" "$DIR/munge/munged.seed"
  chown munge:munge "$DIR/log/munged.log" "$DIR/run/munged.pid" "$DIR/munge/munged.seed"
  runuser -u munge -- munged --socket="$SOCKET" --key-file=/etc/munge/munge.key \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" --force
  wait_until 20 "munged answering" munge_ok || die "munged did not answer; see $DIR/log/munged.log"

  slurmctld -f "$CONF"
  wait_until 30 "slurmctld answering" ctld_ok || die "slurmctld did not answer; see $DIR/log/slurmctld.log"
  slurmd -f "$CONF"
  if ! wait_until "$TIMEOUT" "node $NODE idle" node_idle; then
    log "node $NODE is '$(node_state)' after ${TIMEOUT} s; last lines of the logs:"
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
    exit 1
  fi
  log "up in $((SECONDS - t0)) s: $(sinfo -h -N -o '%N %t cpus=%c mem=%m gres=%G' | head -1)"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
esac
