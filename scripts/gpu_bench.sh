#!/usr/bin/env bash
# Issue 14's benchmarks (bench/gpu_grpo.py) on one GPU host, with the offline bundle unpacked in $SITE (see
# scripts/gpu_env.sh). Each phase stays under 10 minutes; its outputs go to $OUT/<phase>/ and, packed, to
# $OUT/<phase>.tgz (hosts that hand back only a few files per call keep everything). Ends with the scaling table.
#   bash scripts/gpu_bench.sh w1      # >= 3 GPUs: rlvr preset (+ engine asleep) on GPU 0, TRL on GPU 1, standalone
#                                     # vLLM on GPU 2, 0.5B; with 2 GPUs no standalone lane (about 8 minutes)
#   bash scripts/gpu_bench.sh split2  # 2 GPUs: split2_async1 at 1.5B (lean outputs; + staged sync) and 0.5B
#   bash scripts/gpu_bench.sh split4  # 4 GPUs: split4_async1 at 1.5B and 0.5B (about 6 minutes)
#   bash scripts/gpu_bench.sh c15     # 1 GPU: the colocated preset at 1.5B (about 4 minutes)
set -uo pipefail
WHICH="${1:?usage: gpu_bench.sh w1|split2|split4|c15}"; shift || true
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
dir="$OUT/$WHICH"
mkdir -p "$dir"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader > "$dir/host.txt"
git -C "$REPO" rev-parse --short HEAD >> "$dir/host.txt" 2>/dev/null || true
bench() { # tag, seconds, bench args...
  local tag=$1 secs=$2; shift 2
  mkdir -p "$dir/$tag"
  timeout -s TERM "$secs" python3 bench/gpu_grpo.py --out "$dir/$tag" --budget-s $((secs - 10)) "$@" \
    > "$dir/$tag/console.txt" 2>&1
  echo "$tag exit $?" | tee -a "$dir/host.txt"
}
case "$WHICH" in
  w1)
    lanes=trl,standalone; [ "$n" -ge 3 ] || lanes=trl
    bench w1 560 --shape qwen2.5-0.5b --configs colocate1 --lanes "$lanes" --steps 6 \
      --extra-configs "colocate1:sleep=--rollout.colocate-sleep True" --run-timeout-s 250 --reserve-per-run-s 200 \
      --trl-timeout-s 430 ;;
  split2)
    bench split2_1.5b 330 --shape qwen2.5-1.5b --configs "" --lanes none --steps 6 --run-timeout-s 200 \
      --reserve-per-run-s 120 --extra-configs "split2_async1:lean=;split2_async1:staged=--rollout.vllm-staged-sync True"
    bench split2_0.5b 200 --shape qwen2.5-0.5b --configs split2_async1 --lanes none --steps 6 --run-timeout-s 190 ;;
  split4)
    bench split4_1.5b 280 --shape qwen2.5-1.5b --configs split4_async1 --lanes none --steps 6 --run-timeout-s 265
    bench split4_0.5b 250 --shape qwen2.5-0.5b --configs split4_async1 --lanes none --steps 6 --run-timeout-s 235 ;;
  c15)
    bench c15 300 --shape qwen2.5-1.5b --configs colocate1 --lanes none --steps 6 --run-timeout-s 285 ;;
  *) echo "unknown phase $WHICH" >&2; exit 2 ;;
esac
find "$dir" -name bench.jsonl -print0 | xargs -0 -r python3 bench/scaling_table.py | tee "$dir/scaling_table.txt"
tar -czf "$OUT/$WHICH.tgz" -C "$OUT" "$WHICH"
