#!/usr/bin/env bash
# A real Slurm cluster of one node (or two, ARENAFLOW_SLURM_NODES=2) on this machine, for tests and
# CI (Debian/Ubuntu, root).
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
# One cluster per machine: a second one (another DIR and ports) answers sinfo/sbatch given
# SLURM_CONF, but Snakemake's jobs do not reach it: the Slurm jobstep executor clears SLURM_*
# but a job's identity before its inner srun, which then reads /etc/slurm/slurm.conf, the
# first cluster's.
#
# Several nodes (ARENAFLOW_SLURM_NODES=N, 1 to 9; default 1, the single-node cluster above
# unchanged): N slurmd on this host in Slurm's multiple-slurmd mode, `slurmd -N afnodeI`, each
# NodeName with its own Port (ARENAFLOW_SLURMD_PORT + I - 1), pid file, log and spool dir (%n),
# and its own NGPU fake devices under DIR/dev/afnodeI. Debian's Slurm (22.05) is built with it
# (`scontrol show config`: MULTIPLE_SLURMD = Yes; tried: both slurmd register, a 2-node srun runs
# a task on each), so no network namespaces: one host, one address, no veth or bridge to make (a
# sandbox such as gVisor may not allow them).
# The node names resolve to 127.0.0.1 through one line that `start` adds to /etc/hosts (tagged
# with DIR; `stop` removes it): multi-node training rendezvouses at the first node's name.
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
NNODES=${ARENAFLOW_SLURM_NODES:-1}
NODE=$(hostname -s)
export SLURM_CONF=$CONF
[[ $NNODES =~ ^[1-9]$ ]] || { echo "slurm-local: ARENAFLOW_SLURM_NODES=$NNODES: want 1 to 9" >&2; exit 1; }
# One node: this machine's name, as slurmd -C reports it. Several: slurmd's multiple-slurmd mode
# (one slurmd per NodeName, each on its own port, all on this host); their names resolve to
# 127.0.0.1 through /etc/hosts (the rendezvous of multi-node training connects to the first).
if ((NNODES == 1)); then NODES=("$NODE"); else
  NODES=(); for ((i = 1; i <= NNODES; i++)); do NODES+=("afnode$i"); done
fi
HOSTS_TAG="# scripts/slurm-local.sh $DIR"

log() { echo "slurm-local: $*" >&2; }
die() { log "$*"; exit 1; }

alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_state() { sinfo -h -N -n "$1" -o %t 2>/dev/null | head -1; }

# one node keeps the single-node names (slurmd.pid, slurmd.log); several get one per node
slurmd_file() {  # slurmd_file run|log|state NODE
  local dir=$DIR/$1 ext=; [[ $1 == run ]] && ext=.pid; [[ $1 == log ]] && ext=.log
  ((NNODES == 1)) && echo "$dir/slurmd$ext" || echo "$dir/slurmd-$2$ext"
}

# the names of several nodes resolve to this machine: one tagged line in /etc/hosts
hosts_entry() {
  remove_hosts_entry
  ((NNODES > 1)) || return 0
  echo "127.0.0.1 ${NODES[*]} $HOSTS_TAG" >>/etc/hosts
}
remove_hosts_entry() {
  grep -qF "$HOSTS_TAG" /etc/hosts 2>/dev/null || return 0
  # in place (/etc/hosts may be a bind mount that a rename would not replace)
  local kept; kept=$(grep -vF "$HOSTS_TAG" /etc/hosts); printf '%s\n' "$kept" >/etc/hosts
}

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
  local f
  for f in "$DIR"/run/slurmd.pid "$DIR"/run/slurmd-*.pid; do
    [[ -e $f ]] && stop_pidfile "$f" "$(basename "$f" .pid)"
  done
  stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
  stop_pidfile "$DIR/run/munged.pid" munged
  if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then rm -f "$ETC_CONF"; fi
  remove_hosts_entry
}

status() {
  local n s ok=0
  alive "$DIR/run/munged.pid" && alive "$DIR/run/slurmctld.pid" \
    || { log "not running (pid files in $DIR/run)"; return 1; }
  for n in "${NODES[@]}"; do
    alive "$(slurmd_file run "$n")" || { log "slurmd of $n not running"; return 1; }
    s=$(node_state "$n")
    case $s in
      idle|mix|mixed|alloc|allocated) log "node $n: $s" ;;
      *) log "node $n: ${s:-no answer}"; ok=1 ;;
    esac
  done
  return $ok
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
  local i n dev gres=() nodelines=()
  for n in "${NODES[@]}"; do
    # one node: DIR/dev/gpuI as before; several: DIR/dev/NODE/gpuI, each node its own devices
    dev=$DIR/dev; ((NNODES == 1)) || dev=$DIR/dev/$n
    mkdir -p "$dev"
    for ((i = 0; i < NGPU; i++)); do
      # a character device (the numbers of /dev/null): enough for slurmd to count and bind it
      [[ -c $dev/gpu$i ]] || mknod "$dev/gpu$i" c 1 3
      gres+=("NodeName=$n Name=gpu File=$dev/gpu$i")
    done
    # several slurmd on one host: each its own port (multiple-slurmd mode), the same NodeHostname
    local where="NodeAddr=127.0.0.1"
    ((NNODES == 1)) || where="NodeHostname=$NODE NodeAddr=127.0.0.1 Port=$((SLURMD_PORT + ${#nodelines[@]}))"
    nodelines+=("NodeName=$n $where CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem Gres=gpu:$NGPU State=UNKNOWN")
  done
  local what="a single-node test cluster, $NGPU fake GPUs"
  ((NNODES == 1)) || what="a test cluster of $NNODES nodes on one host, $NGPU fake GPUs per node"
  local nodelist; nodelist=$(IFS=,; echo "${NODES[*]}")
  cat >"$CONF.new" <<EOF
# Written by scripts/slurm-local.sh: $what, no slurmdbd.
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
SlurmdSpoolDir=$(slurmd_file state %n)
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$(slurmd_file run %n)
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$(slurmd_file log %n)
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
$(printf '%s\n' "${nodelines[@]}")
PartitionName=debug Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP
EOF
  {
    echo "# Written by scripts/slurm-local.sh: fake GPUs, character devices under $DIR/dev"
    printf '%s\n' "${gres[@]}"
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
nodes_idle() {
  local n
  for n in "${NODES[@]}"; do [[ $(node_state "$n") == idle ]] || return 1; done
}
node_states() { sinfo -h -N -o '%N %t' 2>/dev/null | tr '\n' ' '; }

start() {
  local t0=$SECONDS
  [[ $(id -u) == 0 ]] || die "run as root (slurmd must be root)"
  install_packages
  if status 2>/dev/null; then
    write_config
    if cmp -s "$CONF.new" "$CONF" && cmp -s "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"; then
      rm -f "$CONF.new" "$DIR/etc/gres.conf.new"
      wait_until "$TIMEOUT" "${NODES[*]} idle" nodes_idle || die "running, but: $(node_states)"
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
  hosts_entry

  touch "$DIR/log/munged.log" "$DIR/run/munged.pid" "$DIR/munge/munged.seed"
  chown munge:munge "$DIR/log/munged.log" "$DIR/run/munged.pid" "$DIR/munge/munged.seed"
  runuser -u munge -- munged --socket="$SOCKET" --key-file=/etc/munge/munge.key \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" --force
  wait_until 20 "munged answering" munge_ok || die "munged did not answer; see $DIR/log/munged.log"

  slurmctld -f "$CONF"
  wait_until 30 "slurmctld answering" ctld_ok || die "slurmctld did not answer; see $DIR/log/slurmctld.log"
  local n
  if ((NNODES == 1)); then slurmd -f "$CONF"; else
    for n in "${NODES[@]}"; do mkdir -p "$(slurmd_file state "$n")"; slurmd -f "$CONF" -N "$n"; done
  fi
  if ! wait_until "$TIMEOUT" "${NODES[*]} idle" nodes_idle; then
    log "nodes after ${TIMEOUT} s: $(node_states); last lines of the logs:"
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR"/log/slurmd*.log >&2 || true
    exit 1
  fi
  log "up in $((SECONDS - t0)) s: $(sinfo -h -N -o '%N %t cpus=%c mem=%m gres=%G' | tr '\n' ';')"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
esac
