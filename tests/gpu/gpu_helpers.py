"""Helpers for the GPU tests: a tiny Qwen2 built in code, and engine / trainer worker processes.

Each vLLM engine and each trainer lives in its own spawned process pinned to one GPU (CUDA_VISIBLE_DEVICES
set before torch touches CUDA), driven over a Pipe: `call(method, *args)` runs `VLLMEngine.method` (or a
trainer command) there and returns the result or raises with the remote traceback. A trainer's IPC send
asks the test process to deliver each chunk to the engine (the role Ray plays in a run).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from pathlib import Path
from typing import Any

HIDDEN, LAYERS, HEADS, KV_HEADS = 256, 2, 4, 2  # head_dim 64: a size every vLLM attention backend supports


def build_tiny_dir(path: str | Path, seed: int = 0) -> str:
    """A tiny Qwen2 (random init, bf16) + the copy task's BPE tokenizer, written as an HF directory."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rlvr.data import builtin_corpus
    from rlvr.models.tiny import build_tokenizer

    tok = build_tokenizer(builtin_corpus("copy"), 256)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def make_cfg(
    max_new_tokens: int = 32,
    inflight_updates: bool = True,
    colocate: bool = False,
    gpu_memory_utilization: float = 0.25,
    staged: bool = False,
    lean: bool = True,
) -> Any:
    from rlvr.config import ExperimentConfig

    cfg = ExperimentConfig()
    cfg.rollout.backend = "vllm"
    cfg.rollout.vllm_gpu_memory_utilization = gpu_memory_utilization
    cfg.rollout.vllm_enforce_eager = True  # no CUDA-graph capture: faster start, and these tests time nothing
    cfg.rollout.inflight_updates = inflight_updates
    cfg.rollout.vllm_staged_sync = staged  # NCCL syncs received in the background (rlvr.rollout.vllm_staged)
    cfg.rollout.vllm_lean_outputs = lean  # the default: flat log-probs, text decoded once per finished sample
    cfg.cluster.colocate = colocate
    cfg.generation.max_new_tokens = max_new_tokens
    cfg.data.max_prompt_tokens = 64
    return cfg


def copy_pairs(tokenizer: Any, num: int = 8) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids + EOS) of copy-task lines such as "fdfc=" -> "fdfc"."""
    from rlvr.data import builtin_corpus

    lines = [line for line in builtin_corpus("copy") if "=" in line][-num:]
    out = []
    for line in lines:
        prompt, answer = line.split("=", 1)
        out.append((tokenizer(prompt + "=")["input_ids"], tokenizer(answer)["input_ids"] + [tokenizer.eos_token_id]))
    return out


# ---------------------------------------------------------------------- worker processes
def _pin(gpu: str) -> None:
    """Pin to GPU `gpu` ("0", "1": indices among the GPUs the test process sees, so a harness started with
    CUDA_VISIBLE_DEVICES=2 puts its workers on physical GPU 2, not on GPU 0 beside another job)."""
    seen = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(seen[int(g)] if seen else g for g in gpu.split(","))
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


def _serve(conn: Any, target: Any, extra: dict[str, Any]) -> None:
    while True:
        method, args, kwargs = conn.recv()
        if method == "__close__":
            conn.send(("ok", None))
            return
        try:
            attr = extra.get(method) or getattr(target, method)
            conn.send(("ok", attr(*args, **kwargs) if callable(attr) else attr))  # attributes: policy_version
        except BaseException:  # the worker's boundary: the traceback goes back to the test
            conn.send(("err", traceback.format_exc()))


def _engine_main(conn: Any, gpu: str, model_dir: str, cfg: Any, kwargs: dict[str, Any]) -> None:
    _pin(gpu)
    import torch

    from rlvr.rollout.vllm_engine import VLLMEngine

    try:
        engine = VLLMEngine(model_dir, 0, cfg=cfg, **kwargs)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    try:
        _serve(conn, engine, {"mem_get_info": lambda: torch.cuda.mem_get_info()})
    finally:
        engine.shutdown()


class _Trainer:
    """The learner stand-in: an HF model on its GPU, SFT steps, learner log-probs, weight senders."""

    def __init__(self, conn: Any, model_dir: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.conn = conn
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).cuda()
        self.sender: Any = None

    def sft(self, steps: int = 60, lr: float = 3e-3) -> list[float]:
        """A few SFT steps on copy-task lines (EOS-terminated), then cast to bf16 (what the engines run)."""
        import torch

        from rlvr.data import builtin_corpus

        lines = [line for line in builtin_corpus("copy") if "=" in line]
        rows = [self.tok(line)["input_ids"] + [self.tok.eos_token_id] for line in lines]
        opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        g = torch.Generator().manual_seed(0)
        losses = []
        self.model.train()
        for _ in range(steps):
            idx = torch.randint(0, len(rows), (64,), generator=g).tolist()
            width = max(len(rows[i]) for i in idx)
            ids = torch.full((64, width), self.tok.pad_token_id, dtype=torch.long)
            labels = torch.full((64, width), -100, dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(rows[i])] = torch.tensor(rows[i])
                labels[r, : len(rows[i])] = torch.tensor(rows[i])
            loss = self.model(input_ids=ids.cuda(), labels=labels.cuda()).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
        self.model = self.model.to(torch.bfloat16).eval()
        return losses

    def logprobs(self, pairs: list[tuple[list[int], list[int]]], temperature: float = 1.0) -> list[list[float]]:
        """Learner log-probs (rlvr.learner.logprobs.packed_logprobs) of each completion given its prompt."""
        import torch

        from rlvr.learner.logprobs import packed_logprobs

        out = []
        with torch.no_grad():
            for prompt, completion in pairs:
                ids = torch.tensor([list(prompt) + list(completion)], device="cuda")
                pos = torch.arange(ids.shape[1], device="cuda").unsqueeze(0)
                lp, _ = packed_logprobs(self.model, ids, pos, temperature=temperature, attention="varlen")
                out.append(lp[0, len(prompt) :].float().tolist())
        return out

    def metadata(self) -> dict[str, list]:
        from rlvr.weight_sync.nccl import weight_metadata

        return weight_metadata(self.model.named_parameters())

    def init_nccl(self, addr: str, port: int, world_size: int) -> dict[str, Any]:
        from rlvr.weight_sync.nccl import NcclWeightSender

        self.sender = NcclWeightSender(addr, port, world_size, 0)
        return self.sender.update_info(self.metadata())

    def send_nccl(self) -> dict[str, float]:
        return self.sender.send(self.model.named_parameters(), self.metadata())

    def send_ipc(self) -> dict[str, float]:
        from rlvr.weight_sync.ipc import IpcWeightSender

        def deliver(info: dict[str, Any]) -> None:
            self.conn.send(("chunk", info))
            assert self.conn.recv() == "ack"

        return IpcWeightSender(deliver).send(self.model.named_parameters(), self.metadata())


def _trainer_main(conn: Any, gpu: str, model_dir: str) -> None:
    _pin(gpu)
    try:
        trainer = _Trainer(conn, model_dir)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    _serve(conn, trainer, {})


class Proc:
    """A spawned worker process driven over a Pipe."""

    def __init__(self, target: Any, args: tuple, start_timeout: float = 300) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, *args))  # not daemonic: vLLM starts children
        self.proc.start()
        self._result(start_timeout)

    def send(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.conn.send((method, args, kwargs))

    def _result(self, timeout: float, on_chunk: Any = None) -> Any:
        while True:
            if not self.conn.poll(timeout):
                raise TimeoutError(f"worker gave no answer within {timeout}s")
            msg = self.conn.recv()
            if msg[0] == "chunk":
                on_chunk(msg[1])
                self.conn.send("ack")
                continue
            status, value = msg
            if status == "err":
                raise RuntimeError(f"worker failed:\n{value}")
            return value

    def result(self, timeout: float = 300, on_chunk: Any = None) -> Any:
        return self._result(timeout, on_chunk)

    def call(self, method: str, *args: Any, timeout: float = 300, **kwargs: Any) -> Any:
        self.send(method, *args, **kwargs)
        return self._result(timeout)

    def close(self) -> None:
        try:
            if self.proc.is_alive():
                self.send("__close__")
                self._result(120)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def engine_proc(gpu: str, model_dir: str, cfg: Any, **kwargs: Any) -> Proc:
    return Proc(_engine_main, (gpu, model_dir, cfg, kwargs))


def trainer_proc(gpu: str, model_dir: str) -> Proc:
    return Proc(_trainer_main, (gpu, model_dir))
