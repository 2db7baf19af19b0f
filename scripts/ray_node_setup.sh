#!/usr/bin/env bash
# ray_node_setup.sh: run on every node of a multi-node job; starts this node's part of a Ray cluster.
#
#   scripts/ray_node_setup.sh [options] [-- COMMAND ...]
#
# The node with rank 0 (the leader) starts the Ray head, waits for the expected number of nodes, then runs
# COMMAND (e.g. `rlvr train --config configs/gpu-2node.yaml`) with RAY_ADDRESS exported and exits with
# COMMAND's exit status. Every other node joins the head (waiting for it to come up) and blocks; it exits 0
# when the head goes away (the job ended). Signals (TERM, INT, HUP) go to COMMAND on the leader and to the
# local Ray node everywhere. On exit only the Ray processes this script started are stopped (the
# `ray start --block` process is sent SIGTERM and shuts down its own children): no `ray stop`, which would
# kill every Ray node of the machine, and nothing is killed by name.
#
# Leader and rank are discovered from the first environment that matches, in this order:
#   explicit     RLVR_HEAD_ADDRESS (host or host:port) + RLVR_NODE_RANK (0 = leader); RLVR_NUM_NODES
#   KubeRay      KUBERAY_GEN_RAY_START_CMD is set: the operator starts Ray itself; the head pod (no FQ_RAY_IP)
#                runs COMMAND against it, worker pods exit at once
#   Beaker       BEAKER_LEADER_REPLICA_HOSTNAME + BEAKER_REPLICA_RANK; BEAKER_REPLICA_COUNT
#   Kubernetes   JOB_COMPLETION_INDEX (indexed Job) + RLVR_K8S_HEAD_HOST, or RLVR_K8S_SERVICE (headless
#                Service): the head is pod 0, `<job-name>-0.<service>` (job name = $HOSTNAME less `-<index>`)
#   Slurm        SLURM_NODEID + SLURM_JOB_NODELIST (first host, via `scontrol show hostnames` when on PATH,
#                else parsed); SLURM_JOB_NUM_NODES / SLURM_NNODES
#   none         a single node: this host is the leader
#
# Options (each also settable by the environment variable named):
#   --port P               RLVR_RAY_PORT          GCS port of the head (default 6379)
#   --dashboard-port P     RLVR_RAY_DASHBOARD_PORT dashboard / job API port on the head (default 8265)
#   --temp-dir DIR         RLVR_RAY_TEMP_DIR      this node's Ray temp dir (default Ray's, /tmp/ray)
#   --num-cpus N           RLVR_NUM_CPUS          CPUs this node offers Ray (default: Ray detects)
#   --num-gpus N           RLVR_NUM_GPUS          GPUs this node offers Ray (default: Ray detects)
#   --num-nodes N          RLVR_NUM_NODES         nodes the leader waits for before COMMAND (default from the
#                                                 scheduler's environment, else 1)
#   --node-ip IP           RLVR_NODE_IP           address this node advertises (default: Ray picks)
#   --print-plan                                  print the resolved role/head/rank and exit; starts nothing
#   RLVR_RAY_START_ARGS    extra `ray start` arguments, word-split (e.g. distinct agent ports per node)
#   RLVR_HEAD_WAIT_S       seconds a worker waits for the head (default 600); the leader waits as long
#                          for the other nodes to join
#   RLVR_HEAD_LOST_S       seconds of an unreachable head after which a worker leaves (default 30)
#   NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME are exported unchanged to Ray and COMMAND when set.
#   RAY_AUTH_MODE / RAY_AUTH_TOKEN: Ray's token authentication; when the mode is unset and a token exists
#                          (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) every role uses it.
set -euo pipefail

PORT="${RLVR_RAY_PORT:-6379}"
DASHBOARD_PORT="${RLVR_RAY_DASHBOARD_PORT:-8265}"
TEMP_DIR="${RLVR_RAY_TEMP_DIR:-}"
NUM_CPUS="${RLVR_NUM_CPUS:-}"
NUM_GPUS="${RLVR_NUM_GPUS:-}"
NUM_NODES="${RLVR_NUM_NODES:-}"
NODE_IP="${RLVR_NODE_IP:-}"
HEAD_WAIT_S="${RLVR_HEAD_WAIT_S:-600}"
HEAD_LOST_S="${RLVR_HEAD_LOST_S:-30}"
PRINT_PLAN=0
CMD=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
log() { echo "[ray_node_setup rank=${RANK:-?} $(date +%H:%M:%S)] $*" >&2; }
die() { echo "ray_node_setup: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="$2"; shift 2 ;;
        --dashboard-port) DASHBOARD_PORT="$2"; shift 2 ;;
        --temp-dir) TEMP_DIR="$2"; shift 2 ;;
        --num-cpus) NUM_CPUS="$2"; shift 2 ;;
        --num-gpus) NUM_GPUS="$2"; shift 2 ;;
        --num-nodes) NUM_NODES="$2"; shift 2 ;;
        --node-ip) NODE_IP="$2"; shift 2 ;;
        --print-plan) PRINT_PLAN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; CMD=("$@"); break ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

# First host of a Slurm node list: "gpu[003-004,010],cpu1" -> gpu003, "a1,a2" -> a1.
slurm_first_host() {
    local list="$1"
    if command -v scontrol >/dev/null 2>&1; then
        scontrol show hostnames "$list" | head -n 1
        return
    fi
    if [[ "$list" =~ ^([^,\[]+)(\[([^],-]+))? ]]; then
        echo "${BASH_REMATCH[1]}${BASH_REMATCH[3]}"
    else
        die "cannot parse SLURM_JOB_NODELIST=$list"
    fi
}

# Resolve SOURCE, RANK, HEAD_HOST (and HEAD_PORT when the environment names one).
HEAD_PORT="$PORT"
if [[ -n "${RLVR_HEAD_ADDRESS:-}" ]]; then
    SOURCE=explicit
    RANK="${RLVR_NODE_RANK:?RLVR_HEAD_ADDRESS is set: set RLVR_NODE_RANK too (0 on the leader)}"
    HEAD_HOST="${RLVR_HEAD_ADDRESS%%:*}"
    [[ "$RLVR_HEAD_ADDRESS" == *:* ]] && HEAD_PORT="${RLVR_HEAD_ADDRESS##*:}"
elif [[ -n "${KUBERAY_GEN_RAY_START_CMD:-}" ]]; then
    SOURCE=kuberay
    if [[ -n "${FQ_RAY_IP:-}" ]]; then RANK=1; HEAD_HOST="$FQ_RAY_IP"; else RANK=0; HEAD_HOST=127.0.0.1; fi
    HEAD_PORT="${RAY_PORT:-$PORT}"
elif [[ -n "${BEAKER_LEADER_REPLICA_HOSTNAME:-}" ]]; then
    SOURCE=beaker
    RANK="${BEAKER_REPLICA_RANK:-0}"
    HEAD_HOST="$BEAKER_LEADER_REPLICA_HOSTNAME"
    NUM_NODES="${NUM_NODES:-${BEAKER_REPLICA_COUNT:-}}"
elif [[ -n "${JOB_COMPLETION_INDEX:-}" ]]; then
    SOURCE=kubernetes
    RANK="$JOB_COMPLETION_INDEX"
    if [[ -n "${RLVR_K8S_HEAD_HOST:-}" ]]; then
        HEAD_HOST="$RLVR_K8S_HEAD_HOST"
    elif [[ -n "${RLVR_K8S_SERVICE:-}" ]]; then
        host="${HOSTNAME:-$(hostname)}"
        HEAD_HOST="${host%-*}-0.${RLVR_K8S_SERVICE}"
    else
        die "JOB_COMPLETION_INDEX is set but neither RLVR_K8S_HEAD_HOST nor RLVR_K8S_SERVICE names the head"
    fi
elif [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
    SOURCE=slurm
    RANK="${SLURM_NODEID:-0}"
    HEAD_HOST="$(slurm_first_host "$SLURM_JOB_NODELIST")"
    NUM_NODES="${NUM_NODES:-${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}}"
else
    SOURCE=none
    RANK=0
    HEAD_HOST="${NODE_IP:-127.0.0.1}"
fi
NUM_NODES="${NUM_NODES:-1}"
[[ "$RANK" =~ ^[0-9]+$ ]] || die "node rank must be a non-negative integer (got '$RANK' from $SOURCE)"
ROLE=worker; [[ "$RANK" == 0 ]] && ROLE=head
HEAD_ADDRESS="${HEAD_HOST}:${HEAD_PORT}"

RAY_ARGS=(--block --disable-usage-stats)
[[ -n "$TEMP_DIR" ]] && RAY_ARGS+=(--temp-dir "$TEMP_DIR")
[[ -n "$NUM_CPUS" ]] && RAY_ARGS+=(--num-cpus "$NUM_CPUS")
[[ -n "$NUM_GPUS" ]] && RAY_ARGS+=(--num-gpus "$NUM_GPUS")
[[ -n "$NODE_IP" ]] && RAY_ARGS+=(--node-ip-address "$NODE_IP")
if [[ "$ROLE" == head ]]; then
    RAY_ARGS=(--head --port "$HEAD_PORT" --dashboard-host 0.0.0.0 --dashboard-port "$DASHBOARD_PORT" "${RAY_ARGS[@]}")
else
    RAY_ARGS=(--address "$HEAD_ADDRESS" "${RAY_ARGS[@]}")
fi
# shellcheck disable=SC2206  # word splitting of the extra arguments is the documented behaviour
[[ -n "${RLVR_RAY_START_ARGS:-}" ]] && RAY_ARGS+=(${RLVR_RAY_START_ARGS})

if [[ "$PRINT_PLAN" == 1 ]]; then
    echo "source=$SOURCE"
    echo "role=$ROLE"
    echo "rank=$RANK"
    echo "head_address=$HEAD_ADDRESS"
    echo "num_nodes=$NUM_NODES"
    echo "temp_dir=${TEMP_DIR:-<ray default>}"
    echo "nccl_socket_ifname=${NCCL_SOCKET_IFNAME:-}"
    echo "gloo_socket_ifname=${GLOO_SOCKET_IFNAME:-}"
    if [[ "$SOURCE" == kuberay ]]; then echo "ray_start=<started by the KubeRay operator>"
    else echo "ray_start=ray start ${RAY_ARGS[*]}"; fi
    echo "command=${CMD[*]:-}"
    exit 0
fi

[[ -n "${NCCL_SOCKET_IFNAME:-}" ]] && export NCCL_SOCKET_IFNAME
[[ -n "${GLOO_SOCKET_IFNAME:-}" ]] && export GLOO_SOCKET_IFNAME
# `ray start --head` turns token auth on by itself when a token exists, but joining nodes and clients do
# not: give every role the same rule (share the token through RAY_AUTH_TOKEN, e.g. a scheduler secret).
if [[ -z "${RAY_AUTH_MODE:-}" ]] && { [[ -n "${RAY_AUTH_TOKEN:-}" ]] || [[ -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]]; }; then
    export RAY_AUTH_MODE=token
fi
# Draining on SIGTERM is for Ray Serve; a training node has nothing to drain, so stop promptly.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}"

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

RAY_PID=""
CMD_PID=""
TREE=""

# "pid:starttime" of every descendant of $1, read from /proc (no ps needed; nothing is matched by name).
proc_tree() {
    local root="$1" stat line pid p c
    local -A kids=() started=()
    for stat in /proc/[0-9]*/stat; do
        { read -r line < "$stat"; } 2>/dev/null || continue
        pid=${stat#/proc/}; pid=${pid%/stat}
        # shellcheck disable=SC2086  # fields after "pid (comm) ": state ppid ... starttime is the 20th
        set -- ${line##*) }
        kids[$2]+=" $pid"; started[$pid]=${20}
    done
    local queue=("$root")
    while ((${#queue[@]})); do
        p=${queue[0]}; queue=("${queue[@]:1}")
        for c in ${kids[$p]:-}; do echo "$c:${started[$c]}"; queue+=("$c"); done
    done
}

# Remember the processes of the local Ray node: Ray's agents are children of the raylet, and when the
# raylet goes down without its GCS they can outlive `ray start --block`; they are reaped by PID.
remember_tree() { [[ -n "$RAY_PID" ]] && TREE="$TREE $(proc_tree "$RAY_PID" | tr '\n' ' ')"; return 0; }

# Signal $1 to each remembered process still alive with the same start time (no PID reuse accidents).
signal_tree() {
    local sig="$1" entry pid line alive=0
    for entry in $(tr ' ' '\n' <<<"$TREE" | sort -u); do
        pid=${entry%%:*}
        { read -r line < "/proc/$pid/stat"; } 2>/dev/null || continue
        # shellcheck disable=SC2086
        set -- ${line##*) }
        [[ "${20}" == "${entry##*:}" && "$1" != Z ]] || continue
        alive=1
        [[ -n "$sig" ]] && kill "-$sig" "$pid" 2>/dev/null || true
    done
    return $((1 - alive))
}

stop_ray() {
    if [[ -n "$RAY_PID" ]] && kill -0 "$RAY_PID" 2>/dev/null; then
        log "stopping the local Ray node (pid $RAY_PID)"
        remember_tree
        kill -TERM "$RAY_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$RAY_PID" 2>/dev/null || break; sleep 1; done
        kill -0 "$RAY_PID" 2>/dev/null && kill -KILL "$RAY_PID" 2>/dev/null || true
        wait "$RAY_PID" 2>/dev/null || true
    fi
    RAY_PID=""
    if [[ -n "${TREE// /}" ]] && signal_tree ""; then
        log "reaping Ray processes left by the node"
        signal_tree TERM || true
        for _ in $(seq 1 10); do signal_tree "" || break; sleep 1; done
        signal_tree KILL || true
    fi
    TREE=""
}
on_signal() {
    log "received $1"
    [[ -n "$CMD_PID" ]] && kill "-$1" "$CMD_PID" 2>/dev/null || true
    [[ -z "$CMD_PID" ]] && { stop_ray; exit 143; }
    return 0
}
trap stop_ray EXIT
for sig in TERM INT HUP; do trap "on_signal $sig" "$sig"; done

# The number of alive nodes, asked through Ray's own client (prints 0 while the head is unreachable).
alive_nodes() {
    "${RLVR_PYTHON:-python3}" - "$HEAD_ADDRESS" <<'EOF' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))
EOF
}

run_command() {
    export RAY_ADDRESS="$HEAD_ADDRESS"
    log "running: ${CMD[*]}"
    set +e
    "${CMD[@]}" &
    CMD_PID=$!
    local status
    while true; do
        wait "$CMD_PID"; status=$?
        # wait returns >128 when a trapped signal interrupts it; the command is still running then.
        kill -0 "$CMD_PID" 2>/dev/null || break
    done
    set -e
    CMD_PID=""
    log "command exited with status $status"
    return "$status"
}

if [[ "$SOURCE" == kuberay ]]; then
    # The operator runs `ray start` in every pod; only the head pod has anything to run.
    [[ "$ROLE" == head && ${#CMD[@]} -gt 0 ]] || exit 0
    status=0; run_command || status=$?
    exit "$status"
fi

if [[ "$ROLE" == head ]]; then
    log "starting the Ray head at $HEAD_ADDRESS ($SOURCE)"
    ray start "${RAY_ARGS[@]}" &
    RAY_PID=$!
    deadline=$((SECONDS + HEAD_WAIT_S))
    until port_open "$HEAD_HOST" "$HEAD_PORT" && port_open 127.0.0.1 "$DASHBOARD_PORT"; do
        kill -0 "$RAY_PID" 2>/dev/null || { log "ray start --head failed"; exit 1; }
        ((SECONDS < deadline)) || { log "the head did not come up in ${HEAD_WAIT_S}s"; exit 1; }
        sleep 1
    done
    while (( $(alive_nodes) < NUM_NODES )); do
        ((SECONDS < deadline)) || { log "fewer than $NUM_NODES nodes joined in ${HEAD_WAIT_S}s"; exit 1; }
        kill -0 "$RAY_PID" 2>/dev/null || { log "the Ray head exited"; exit 1; }
        sleep 2
    done
    log "cluster up: $NUM_NODES node(s)"
    remember_tree
    if [[ ${#CMD[@]} -eq 0 ]]; then
        log "no command given: serving the head until a signal arrives"
        wait "$RAY_PID" || true
        exit 0
    fi
    status=0; run_command || status=$?
    exit "$status"
fi

# Worker: wait for the head, join, and leave cleanly when the head is gone.
log "waiting for the head at $HEAD_ADDRESS ($SOURCE)"
deadline=$((SECONDS + HEAD_WAIT_S))
until port_open "$HEAD_HOST" "$HEAD_PORT"; do
    ((SECONDS < deadline)) || { log "the head at $HEAD_ADDRESS did not come up in ${HEAD_WAIT_S}s"; exit 1; }
    sleep 2
done
ray start "${RAY_ARGS[@]}" &
RAY_PID=$!
lost_since=""
while kill -0 "$RAY_PID" 2>/dev/null; do
    sleep 2
    remember_tree
    if port_open "$HEAD_HOST" "$HEAD_PORT"; then lost_since=""; continue; fi
    lost_since="${lost_since:-$SECONDS}"
    if ((SECONDS - lost_since >= HEAD_LOST_S)); then
        log "the head at $HEAD_ADDRESS is gone; leaving"
        stop_ray
        exit 0
    fi
done
wait "$RAY_PID" && status=0 || status=$?
RAY_PID=""
if ! port_open "$HEAD_HOST" "$HEAD_PORT"; then
    log "the Ray node stopped after the head went away; exiting cleanly"
    exit 0
fi
log "the Ray node exited with status $status while the head is up"
exit "$status"
