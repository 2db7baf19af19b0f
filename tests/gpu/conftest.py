"""GPU tests: skipped cleanly without CUDA (and, for engine tests, without vllm: each test importorskips it)."""

from __future__ import annotations

import pytest


def need_gpus(num: int, vllm: bool = True) -> None:
    """Skip unless `num` CUDA devices (and vllm, when asked) are available."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.device_count() < num:
        pytest.skip(f"needs {num} GPUs, found {torch.cuda.device_count()}")
    if vllm:
        pytest.importorskip("vllm")


@pytest.fixture(scope="session")
def gpus():
    return need_gpus
