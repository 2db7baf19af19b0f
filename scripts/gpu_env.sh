# Sourced by the GPU scripts (gpu_e2e.sh, gpu_lora.sh): the repo root, the unpacked offline bundle ($SITE, default
# /tmp/site), the output folder ($OUT, default gpu-out/) and the environment vLLM, NCCL and Ray need on such a host.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SITE="${SITE:-/tmp/site}"
OUT="${OUT:-$REPO/gpu-out}"
mkdir -p "$OUT"
cd "$REPO"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_CUMEM_ENABLE=0
export VLLM_WORKER_MULTIPROC_METHOD=spawn TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 PYTHONUNBUFFERED=1
