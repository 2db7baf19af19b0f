#!/usr/bin/env bash
# End-to-end GPU runs of `rlvr train` (Qwen2.5-shaped random-weight models, no hub): 1 learner + 1 vLLM engine on
# two GPUs with async_steps=1, and colocated on one GPU. Needs the gpu-stack bundle unpacked in $SITE.
#   bash scripts/gpu_e2e.sh [2x|colocate|all|tp2|multi2|split4] [extra rlvr flags]
# multi2 (2 GPUs) and split4 (4 GPUs) train with 2 DeepSpeed learner ranks: ZeRO-2 and ZeRO-3 over NCCL.
# STEPS (multi2, split4, tp2) sets the steps; RUN_TIMEOUT (seconds) limits each run, so one that stalls does not use up
# the next one's time.
set -uo pipefail
WHICH="${1:-all}"; shift || true
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
COMMON=(--model.path builtin:qwen2.5-0.5b --data.datasets builtin:copy4 --data.apply-chat-template False
        --rollout.filter-zero-variance False --eval.every-n-steps 0 --eval.at-step-0 False
        --checkpoint.save-final False --checkpoint.output-dir /tmp/rlvr-runs --logging.console-progress False
        --num-steps 20 --generation.max-new-tokens "${MAX_NEW:-256}" --learner.pack-length 4096 --learner.lr 1e-6
        --algorithm.overlong-buffer "${OVERLONG:-128}" --generation.stop-token-ids $(seq 2 600))
# Random weights score 0 on every task; ~600 stop ids (of 151,936) give completions of varied length, and the
# DAPO soft overlong penalty turns that into rewards with variance, so the runs take real gradient steps.
rc=0
run() {
  local name=$1; shift
  echo "== $name: rlvr train $*" | tee -a "$OUT/e2e.log"
  ${RUN_TIMEOUT:+timeout "$RUN_TIMEOUT"} /usr/bin/time -v python3 -m rlvr.cli train "$@" --logging.run-name "$name" 2>&1 | tail -n 60 >> "$OUT/e2e.log"
  local code=${PIPESTATUS[0]}
  echo "== $name exit $code" | tee -a "$OUT/e2e.log"
  cp "/tmp/rlvr-runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null || true
  [ "$code" = 0 ] || rc=1
}
if [ "$WHICH" = colocate ] || [ "$WHICH" = all ]; then
  CUDA_VISIBLE_DEVICES=0 run colocate --config configs/gpu-1x-colocate.yaml "${COMMON[@]}" --rollout.prompts-per-step 16 "$@"
fi
if [ "$WHICH" = 2x ] || [ "$WHICH" = all ]; then
  run gpu2x --config configs/gpu-2x.yaml "${COMMON[@]}" --rollout.prompts-per-step 32 "$@"
fi
if [ "$WHICH" = tp2 ]; then  # 3 GPUs (set CUDA_VISIBLE_DEVICES on bigger hosts): 1 learner + 1 engine of TP 2
  run tp2 --config configs/gpu-2x.yaml "${COMMON[@]}" --cluster.engine-tp 2 --cluster.gpus-per-node 3 \
      --rollout.prompts-per-step 32 --num-steps "${STEPS:-10}" "$@"
fi
if [ "$WHICH" = multi2 ]; then  # 2 GPUs: learner i and engine i colocated on GPU i, ZeRO-3 over 2 ranks
  run multi2_zero3 --config configs/gpu-1x-colocate.yaml "${COMMON[@]}" --cluster.num-learners 2 \
      --cluster.num-engines 2 --cluster.gpus-per-node 2 --learner.zero-stage 3 --rollout.prompts-per-step 16 \
      --num-steps "${STEPS:-5}" "$@"
fi
if [ "$WHICH" = split4 ]; then  # 4 GPUs: 2 learners + 2 engines, ZeRO-2 then ZeRO-3 (ZEROS="3 2": the other order)
  for z in ${ZEROS:-2 3}; do
    run "split4_zero$z" --config configs/gpu-2x.yaml "${COMMON[@]}" --cluster.num-learners 2 --cluster.num-engines 2 \
        --cluster.gpus-per-node 4 --learner.zero-stage "$z" --rollout.prompts-per-step 32 --num-steps "${STEPS:-5}" "$@"
  done
fi
python3 - "$OUT" <<'PY' | tee -a "$OUT/e2e.log"
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.metrics.jsonl"))):
    rows = [json.loads(l) for l in open(f) if l.strip()]
    steps = [r for r in rows if "loss/total" in r]
    if not steps:
        print(os.path.basename(f), "no steps"); continue
    last = steps[-1]
    keys = ["loss/total", "learner/grad_norm", "rollout/staleness_max", "rollout/completion_len_mean",
            "perf/tokens_per_s", "time/step", "time/generation", "time/train", "time/sync", "sync/seconds",
            "sync/bytes", "loss/logprob_drift_mean", "perf/packing_efficiency"]
    print(os.path.basename(f), "steps", len(steps), {k: round(last.get(k, float("nan")), 4) for k in keys})
    print("  step times", [round(r["time/step"], 2) for r in steps])
PY
exit $rc
