#!/usr/bin/env bash
# The GPU proof of LoRA RL (issue 20), on one GPU, with an offline bundle of vllm, ray and deepspeed unpacked in $SITE
# (default /tmp/site; see scripts/gpu_check.sh). Output goes to $OUT (default gpu-out/): logs, metrics, one JSON line
# per figure. Phases (default: all, about 25 minutes; each phase alone stays under 10 minutes):
#   bash scripts/gpu_lora.sh tests   # tests/gpu/test_gpu_lora.py: vLLM log-probs = learner's after an adapter sync,
#                                    # an in-flight adapter update (about 2 minutes)
#   bash scripts/gpu_lora.sh 7b      # configs/gpu-lora-7b.yaml: Qwen2.5-7B shape, LoRA, colocated, 10 steps, peak memory
#   bash scripts/gpu_lora.sh bench   # bench/gpu_grpo.py: 1.5B shape, full fine-tuning vs LoRA rank 16 on one GPU:
#                                    # sync cycle, step time, peak memory per GPU (full_vs_lora line)
set -uo pipefail
WHICH="${1:-all}"; shift || true
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
# peft: the host's own, unless a wheel travelled in .whl/ (here: pip download --no-deps peft==0.21.2 -d .whl)
if ls "$REPO"/.whl/peft-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-peft "$REPO"/.whl/peft-*.whl \
    && export PYTHONPATH="/tmp/site-peft:$PYTHONPATH"
fi
{
  echo "== $(date -u +%FT%TZ) $(hostname) phase $WHICH"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import sys, torch, transformers, vllm, peft, deepspeed; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__, '| peft', peft.__version__, '| deepspeed', deepspeed.__version__)"
} 2>&1 | tee -a "$OUT/gpu_lora.log"
rc=0

if [ "$WHICH" = tests ] || [ "$WHICH" = all ]; then
  python3 -m pytest -m gpu tests/gpu/test_gpu_lora.py -x -v -s -p no:cacheprovider -o timeout=600 "$@" 2>&1 \
    | tee -a "$OUT/gpu_lora_tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi

if [ "$WHICH" = 7b ] || [ "$WHICH" = all ]; then
  # random weights score 0 on copy4: ~600 stop ids give completions of varied length, and the DAPO soft overlong
  # penalty turns that into rewards with variance, so the 10 steps take real gradient steps (as scripts/gpu_e2e.sh)
  # the random-weight 7B directory once (about 2 minutes, 15 GB), outside the timed run
  M7="${M7:-/tmp/rlvr-bench-model-qwen2.5-7b}"
  t0=$SECONDS
  python3 -c "import sys; from rlvr.data import builtin_corpus; from rlvr.models.shaped import \
build_shaped_model_dir; build_shaped_model_dir('qwen2.5-7b', list(builtin_corpus('copy4')), sys.argv[1], 0)" "$M7" \
    2>&1 | tail -n 3 | tee -a "$OUT/gpu_lora.log"
  echo "model dir $M7 ready in $((SECONDS - t0)) s" | tee -a "$OUT/gpu_lora.log"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/lora7b_mem.csv" &
  smi=$!
  python3 -m rlvr.cli train --config configs/gpu-lora-7b.yaml --model.path "$M7" --checkpoint.output-dir /tmp/rlvr-runs \
      --logging.run-name lora7b --checkpoint.resume never --logging.console-progress False \
      --algorithm.overlong-buffer 64 --generation.stop-token-ids $(seq 2 600) "$@" 2>&1 | tail -n 80 > "$OUT/lora7b.console.txt"
  code=${PIPESTATUS[0]}
  kill "$smi" 2>/dev/null
  cp /tmp/rlvr-runs/lora7b/metrics.jsonl "$OUT/lora7b.metrics.jsonl" 2>/dev/null || true
  python3 - "$OUT" "$code" <<'PY' | tee -a "$OUT/gpu_lora.log"
import json, os, sys
out, code = sys.argv[1], int(sys.argv[2])
peak = {}
for line in open(os.path.join(out, "lora7b_mem.csv")):
    idx, _, used = line.partition(",")
    if idx.strip().isdigit():
        peak[idx.strip()] = max(peak.get(idx.strip(), 0.0), float(used) / 1024)
path = os.path.join(out, "lora7b.metrics.jsonl")
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
steps = [r for r in rows if "time/train" in r]
def m(k):
    v = [r[k] for r in steps[1:] or steps if k in r]
    return round(sum(v) / len(v), 4) if v else None
print(json.dumps({"kind": "lora7b", "exit": code, "steps": len(steps), "peak_mem_gib_per_gpu": {k: round(v, 2) for k, v in peak.items()},
                  "sync_cycle_s": m("time/sync"), "sync_bytes": m("sync/bytes"), "step_s": m("time/step"),
                  "train_s": m("time/train"), "grad_norm": m("learner/grad_norm"), "loss": [r.get("loss/total") for r in steps],
                  "reward_mean": [r.get("reward/total_mean") for r in steps]}))
PY
  [ "$code" = 0 ] || rc=1
fi

if [ "$WHICH" = bench ] || [ "$WHICH" = all ]; then
  python3 bench/gpu_grpo.py --shape qwen2.5-1.5b --configs colocate1 --lanes none --steps 6 --lora-compare 16 \
      --extra "--rollout.colocate-sleep False" --budget-s 560 --run-timeout-s 260 --out "$OUT" 2>&1 \
    | tee -a "$OUT/gpu_lora_bench.log" | grep '"kind": "\(full_vs_lora\|summary\)"'
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
echo "== gpu_lora.sh $WHICH exit $rc" | tee -a "$OUT/gpu_lora.log"
exit "$rc"
