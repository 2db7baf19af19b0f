#!/usr/bin/env bash
# The fast LoRA weight sync (issue 20, transport "lora_ipc": CUDA IPC buffer + vLLM worker extension) against the
# adapter-directory path ("shm", RLVR_LORA_SYNC=shm), on one GPU, with the offline bundle in $SITE (default /tmp/site;
# see scripts/gpu_env.sh) and peft from .whl/ (as scripts/gpu_lora.sh). Output in $OUT (default gpu-out/).
#   bash scripts/gpu_lora_sync_check.sh tests   # tiny Qwen2: vLLM log-probs after a lora_ipc sync = learner's and =
#                                               # the shm path's; in-flight update; both paths' sync timings
#                                               # (tests/gpu/test_gpu_lora_ipc.py, then test_gpu_lora.py; ~3 min)
#   bash scripts/gpu_lora_sync_check.sh shape   # the same test on the Qwen2.5-1.5B shape, rank 16: realistic
#                                               # per-sync timings of both paths side by side (~4 min)
#   bash scripts/gpu_lora_sync_check.sh bench-ipc  # bench/gpu_grpo.py colocate1, LoRA r16, 6 steps, lora_ipc (~6 min)
#   bash scripts/gpu_lora_sync_check.sh bench-shm  # the same run with RLVR_LORA_SYNC=shm (~6 min)
# Each phase stays under 10 minutes; `all` runs tests, shape, bench-ipc, bench-shm in turn. Figures: the JSON lines
# with "check" (tests) and the "kind": "rlvr" lines' weight_sync (bench: cycle_s, learner_send_s, engine_*).
set -uo pipefail
WHICH="${1:-tests}"; shift || true
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
if ls "$REPO"/.whl/peft-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-peft "$REPO"/.whl/peft-*.whl \
    && export PYTHONPATH="/tmp/site-peft:$PYTHONPATH"
fi
LOG="$OUT/gpu_lora_sync.log"
M15="${M15:-/tmp/rlvr-bench-model-qwen2.5-1.5b}"
{
  echo "== $(date -u +%FT%TZ) $(hostname) phase $WHICH"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import sys, torch, vllm, peft; print('python', sys.version.split()[0], '| torch', torch.__version__, '| vllm', vllm.__version__, '| peft', peft.__version__)"
} 2>&1 | tee -a "$LOG"
rc=0
run() { [ "$WHICH" = "$1" ] || [ "$WHICH" = all ]; }

if run tests; then
  python3 -m pytest -m gpu tests/gpu/test_gpu_lora_ipc.py tests/gpu/test_gpu_lora.py -x -v -s -p no:cacheprovider \
      -o timeout=600 "$@" 2>&1 | tee -a "$OUT/gpu_lora_sync_tests.log" | grep -E '"check"|PASSED|FAILED|SKIPPED|Error|error'
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi

if run shape; then
  t0=$SECONDS
  python3 -c "import sys; from rlvr.data import builtin_corpus; from rlvr.models.shaped import \
build_shaped_model_dir; build_shaped_model_dir('qwen2.5-1.5b', list(builtin_corpus('copy4')), sys.argv[1], 0)" "$M15" \
    2>&1 | tail -n 3 | tee -a "$LOG"
  echo "model dir $M15 ready in $((SECONDS - t0)) s" | tee -a "$LOG"
  RLVR_LORA_SYNC_MODEL="$M15" RLVR_LORA_SYNC_RANK=16 python3 -m pytest -m gpu tests/gpu/test_gpu_lora_ipc.py -x -v -s \
      -p no:cacheprovider -o timeout=600 "$@" 2>&1 | tee -a "$OUT/gpu_lora_sync_shape.log" \
    | grep -E '"check"|PASSED|FAILED|SKIPPED|Error|error'
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi

bench() {  # $1: tag; the run's transport comes from RLVR_LORA_SYNC in the environment
  python3 bench/gpu_grpo.py --shape qwen2.5-1.5b --configs "" --lanes none --steps 6 \
      --extra-configs "colocate1:$1=--learner.lora-rank 16 --learner.lora-alpha 32 --learner.lr 1e-5" \
      --extra "--rollout.colocate-sleep False" --budget-s 540 --run-timeout-s 420 --out "$OUT/bench_$1" 2>&1 \
    | tee -a "$OUT/gpu_lora_sync_bench.log" | grep '"kind": "rlvr"' \
    | python3 -c "import json, sys
for line in sys.stdin:
    r = json.loads(line[line.index('{'):])
    print(json.dumps({'tag': r.get('tag'), 'rc': r.get('rc'), 'timed_out': r.get('timed_out'),
                      'steps_measured': r.get('steps_measured'), 'step_wall_s': r.get('step_wall_s'),
                      'weight_sync': r.get('weight_sync'), 'peak_mem_gib': r.get('peak_mem_gib')}))" | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
}
if run bench-ipc; then RLVR_LORA_SYNC=auto bench lora_r16_ipc; fi
if run bench-shm; then RLVR_LORA_SYNC=shm bench lora_r16_shm; fi

echo "== gpu_lora_sync_check.sh $WHICH exit $rc" | tee -a "$LOG"
exit "$rc"
