#!/usr/bin/env bash
# GPU tests (tests/gpu, marker `gpu`) on a GPU host, with an offline bundle of the GPU wheels (torch, vllm, ray,
# deepspeed at the versions of docs/gpu-results/README.md; not part of this repository) unpacked into $SITE (default
# /tmp/site). Run from anywhere; output is tee'd to $OUT/gpu_tests.log.
#   bash scripts/gpu_check.sh [extra pytest args, e.g. -k nccl]
# GPU_TEST_TIMEOUT (seconds, default 600) limits each test, so one that hangs fails with its stack instead of using up
# the whole call (e.g. GPU_TEST_TIMEOUT=150 where a call has 10 minutes).
# Two GPUs run every test; with one, the NCCL tests (trainer and engine on separate GPUs) skip.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SITE="${SITE:-/tmp/site}"
OUT="${OUT:-$REPO/gpu-out}"
mkdir -p "$OUT"
cd "$REPO"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_USE_FLASHINFER_SAMPLER=0        # flashinfer is not in the bundle
export NCCL_CUMEM_ENABLE=0                  # as in gpu-stack's verified NCCL weight-transfer example
export VLLM_WORKER_MULTIPROC_METHOD=spawn   # engines start from processes that run threads
export TOKENIZERS_PARALLELISM=false
{
  echo "== $(date -u +%FT%TZ) $(hostname)"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import sys, torch, transformers, vllm, ray, deepspeed; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__, '| ray', ray.__version__, '| deepspeed', deepspeed.__version__)"
} 2>&1 | tee "$OUT/gpu_tests.log"
set +e
python3 -m pytest -m gpu tests/gpu -x -v -s -p no:cacheprovider -o timeout="${GPU_TEST_TIMEOUT:-600}" "$@" 2>&1 | tee -a "$OUT/gpu_tests.log"
rc=${PIPESTATUS[0]}
echo "== pytest exit code $rc" | tee -a "$OUT/gpu_tests.log"
exit "$rc"
