"""Typed config: one dataclass per section (docs/design.md, Config), and the root `ExperimentConfig`.

Every field has a docstring (tyro renders it as `--help` text and the README's config reference is generated
from it, `python -m rlvr.config.reference`). Defaults are written here once, the single source (docs/design.md,
Config), and cite their source. This module imports only the standard library so that `import rlvr.config` stays
fast on a login node (a test checks that torch/ray/vllm/deepspeed stay out).
Values discovered at run time (world size, GPU count) live in the run context, never here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ModelConfig:
    """The policy model."""

    path: str = "builtin:tiny"
    """Local HF directory, hub name, or `builtin:tiny` (a small Qwen2-shaped model with random weights and
    a BPE tokenizer trained on the datasets' text: built-in tasks and local files, built in code: no downloads)."""
    tokenizer_path: str | None = None
    """Tokenizer location when it differs from `path`."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype: `auto` = bfloat16 on GPU, float32 on CPU."""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "torch_varlen"] = "auto"
    """Learner attention kernels: `auto` = flash_attention_2 when installed on GPU, else `torch_varlen` (torch's
    own flash varlen kernel over packed rows) on GPU, else sdpa."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (open-instruct always turns it on for GPUs)."""
    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's (a file path or the template text)."""
    trust_remote_code: bool = False
    """Allow model code from the model directory (transformers `trust_remote_code`)."""
    tiny_hidden_size: int = 64
    """Width of the `builtin:tiny` model."""
    tiny_num_layers: int = 2
    """Layers of the `builtin:tiny` model."""
    tiny_num_heads: int = 4
    """Attention heads of the `builtin:tiny` model."""
    tiny_vocab_size: int = 256
    """Target BPE vocabulary size of the `builtin:tiny` tokenizer."""


@dataclass
class DataConfig:
    """Training prompts."""

    datasets: list[str] = field(default_factory=lambda: ["builtin:copy"])
    """Datasets: local JSONL / Parquet / Arrow files, hub names, or built-in offline tasks (`builtin:copy`)."""
    weights: list[float] = field(default_factory=list)
    """Sampling weight per dataset for the mixer (empty = proportional to size)."""
    split: str = "train"
    """Split to read from hub datasets and built-in tasks."""
    prompt_column: str = "prompt"
    """Column holding the prompt text (used when `messages_column` is absent from a row)."""
    messages_column: str = "messages"
    """Column holding chat messages ([{role, content}]); takes precedence over `prompt_column`."""
    ground_truth_column: str = "ground_truth"
    """Column holding the reference answer passed to verifiers."""
    system_prompt: str | None = None
    """System message prepended to every prompt."""
    apply_chat_template: bool = True
    """Render prompts with the tokenizer's chat template (off: raw prompt text)."""
    max_prompt_tokens: int = 512
    """Prompts longer than this are dropped and counted (`data/dropped_too_long`)."""
    shuffle_seed: int = 0
    """Seed of the per-epoch shuffle."""
    num_epochs: int = 1
    """Passes over the training data (the run also stops at `num_steps`)."""
    on_bad_row: Literal["error", "skip"] = "error"
    """`error`: list every malformed row before training, then stop; `skip`: drop and count them."""
    num_builtin_rows: int = 2000
    """Rows generated for a built-in task's training split."""


@dataclass
class GenerationConfig:
    """Sampling settings of the rollout engines."""

    num_samples: int = 8
    """Group size G: completions per prompt (GRPO; default 8)."""
    temperature: float = 1.0
    """Sampling temperature; the learner divides its logits by the same value."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off; keep off in training so learner and engine log-probs agree)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_new_tokens: int = 256
    """Maximum completion length; longer completions end with finish_reason `length`."""
    stop_strings: list[str] = field(default_factory=list)
    """Strings that end a completion (the string is kept in the text)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a completion, in addition to the tokenizer's EOS."""


@dataclass
class RolloutConfig:
    """The generation pipeline."""

    prompts_per_step: int = 16
    """B: prompt groups trained per step (after filtering)."""
    async_steps: int = 1
    """How many policy versions the engines may run ahead of the learner (0 = strictly on-policy)."""
    filter_zero_variance: bool = True
    """Drop groups whose G rewards are all equal: they carry no gradient (DAPO dynamic sampling)."""
    active_sampling: bool = False
    """Keep pulling prompts until B informative groups are collected (DAPO); off: train on what is left."""
    max_pull_factor: float = 4.0
    """With active sampling, stop topping up after pulling this many times B prompts in one step."""
    inflight_updates: bool = True
    """Update weights while requests run (PipelineRL); off: drain running requests before loading."""
    backend: Literal["transformers", "vllm"] = "transformers"
    """Engine implementation: `transformers` (CPU or small GPU runs) or `vllm` (needs the `gpu` extra)."""
    engine_batch_size: int = 32
    """Transformers engine: sequences decoded together."""
    vllm_gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory vLLM may take (colocated runs use less)."""
    vllm_enforce_eager: bool = False
    """Disable CUDA graphs in vLLM."""
    vllm_max_model_len: int = 0
    """vLLM's longest sequence. 0: max prompt + max new tokens, or `env.max_total_tokens` where episodes run
    (`env.name` set, or a built-in task whose rows name an environment); capped by the model's positions. Set it
    for your own data whose `env` column routes rows to an environment."""
    vllm_staged_sync: bool = False
    """NCCL weight syncs (engines on their own GPUs): receive the new weights into a staging copy while the engine
    goes on generating, then load them in one short pause, instead of pausing generation for the whole transfer.
    Costs one copy of the weights in free GPU memory beside vLLM (without it the sync pauses as usual: a warning
    once, and `sync/engine_staged_min` 0 in the metrics); tensor-parallel size 1 only. Measured with lean outputs
    (2 x H200, 1.5B, split2 async 1, docs/gpu-results/w2_lean_*): 10.8k tokens/s/GPU against 10.2k paused, sync
    cycle 0.18 s against 0.15 s, generation paused 0.13 s against 0.14 s per sync; one run each, so off by
    default (the paused sync already meets its targets once the engine answers calls promptly)."""
    vllm_lean_outputs: bool = True
    """vLLM engines hand each finished sample over with less work on the engine process's event loop: vLLM's flat
    log-prob layout (a few lists per request, not a dict and an object per token) and no per-token detokenizing
    (the text is decoded once when the sample ends, as the transformers engine does; requests with stop strings
    are still detokenized by vLLM, which needs the text to find them). Same log-probs; the text is the tokenizer's
    decode of the ids with special tokens skipped. Without it, a weight-update or sleep call waits seconds behind a
    busy engine's output backlog: measured (docs/gpu-results/w1_lean_*, w2_lean_*) the 1.5B sync mid-generation
    0.78 s -> 0.15 s (2 x H200) and the colocated 0.5B step 7.8 s -> 5.7 s (H200). False: vLLM's own outputs."""
    vllm_enable_prefix_caching: bool = True
    """vLLM prefix caching; a per-version cache salt keeps old-weight KV from being reused."""
    colocate_sleep: bool = True
    """Colocated runs: put the engines to sleep (free their GPU memory) while the learners train. False keeps
    them awake and generating during the learner's step (models small enough to fit beside the learner; with
    async_steps >= 1 the faster choice: configs/gpu-1x-colocate.yaml sets it)."""
    timeout_s: float = 600.0
    """Seconds the driver waits for one step's rollouts before failing loudly."""


@dataclass
class RewardFunctionConfig:
    """One reward function applied to every completion."""

    name: str = "math"
    """Registered reward name (`rlvr reward --list` shows each with its params) or an import path `pkg.mod:fn`."""
    weight: float = 1.0
    """Weight in the total reward sum."""
    params: dict[str, float | int | str | bool] = field(default_factory=dict)
    """Keyword arguments passed to the function."""


@dataclass
class RewardsConfig:
    """Reward functions and the verifier pool."""

    functions: list[RewardFunctionConfig] = field(default_factory=list)
    """Functions applied to every completion, besides the verifiers routed per row. On the command line:
    `--rewards.functions NAME[,weight=W][,PARAM=VALUE]...` (one item per function)."""
    verifier_column: str = "verifier"
    """Dataset column naming each row's verifier(s) (open-instruct style routing)."""
    primary: str | None = None
    """Function whose maximum defines `correct` (default: the first routed verifier)."""
    custom: list[str] = field(default_factory=list)
    """Import paths `pkg.module:fn` of user reward functions to register."""
    num_workers: int = 2
    """Verifier worker processes."""
    timeout_s: float = 10.0
    """Per-call time limit; a call that exceeds it scores None (status `timeout`)."""
    max_queue: int = 1024
    """Pending calls before submit blocks (back-pressure)."""


@dataclass
class AlgorithmConfig:
    """Advantages, the policy loss and its corrections (the formulas: rlvr/algorithms/, each module's docstring)."""

    advantage_scale: Literal["group", "batch", "none"] = "group"
    """`group` (GRPO), `batch` (mean per group, std over batch), `none` (Dr. GRPO: centred only)."""
    advantage_std: Literal["unbiased", "population"] = "unbiased"
    """Std flavour: unbiased N-1 (TRL) or population (DeepSeekMath)."""
    advantage_eps: float = 1e-4
    """Added to the std before dividing (TRL)."""
    loss: Literal["dapo", "grpo", "dr_grpo", "gspo", "cispo", "sapo"] = "dapo"
    """Policy loss: clipped surrogate (dapo/grpo/dr_grpo), GSPO sequence ratio, CISPO, SAPO soft gate."""
    aggregation: Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo"] = "auto"
    """Loss normaliser; `auto` takes the loss's paper default (dapo: token-mean over the optimizer step)."""
    clip_eps_low: float = 0.2
    """Lower clip 1 - eps_low (PPO/DAPO)."""
    clip_eps_high: float = 0.28
    """Upper clip 1 + eps_high (DAPO clip-higher)."""
    clip_delta: float | None = None
    """Dual-clip bound for negative advantages (None = off)."""
    cispo_eps_max: float = 5.0
    """CISPO absolute cap on the stop-gradient ratio (MiniMax-M1)."""
    sapo_tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    sapo_tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages."""
    kl_beta: float = 0.0
    """KL penalty weight; 0 drops the reference model entirely."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman): k3 is the low-variance default."""
    tis_mode: Literal["off", "token", "token_mask", "sequence_mask"] = "token"
    """Engine/learner mismatch correction: truncated IS per token (open-instruct default) or masking."""
    tis_cap: float = 2.0
    """TIS cap C (open-instruct 2.0, TRL 3.0); upper bound for mask modes."""
    tis_min: float = 0.5
    """Lower ratio bound for the mask modes."""
    mask_truncated: bool = False
    """Mask completions cut at max_new_tokens out of the loss (they still count in group statistics)."""
    overlong_buffer: int = 0
    """DAPO soft overlong penalty buffer C in tokens (0 = off)."""
    overlong_penalty: float = 1.0
    """Scale of the soft overlong penalty."""
    non_stop_penalty: float | None = None
    """Reward given to completions that end without a stop token (None = off; open-instruct)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = entropy is only logged, without gradient)."""
    num_mini_batches: int = 1
    """Optimizer steps per rollout batch; with >1 the old log-probs are recomputed first so clipping acts."""
    num_epochs: int = 1
    """Passes over each rollout batch."""


@dataclass
class LearnerConfig:
    """Optimizer, DeepSpeed and packing."""

    backend: Literal["deepspeed", "torch"] = "deepspeed"
    """Training engine: DeepSpeed (ZeRO 0/2/3) or plain torch DDP-style all-reduce."""
    lr: float = 1e-6
    """Peak learning rate (AdamW)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup optimizer steps."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = off)."""
    fp32_master_weights: bool = True
    """Torch backend: keep a float32 copy of bfloat16/float16 trainable weights, accumulate gradients and step
    AdamW in float32, and copy the result back (DeepSpeed always does); it costs 8 bytes per trainable weight
    (the copy and its gradient) and AdamW's state is float32. False: AdamW updates the low-precision weights in
    place, and updates below their rounding step are lost."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """DeepSpeed ZeRO stage."""
    offload_optimizer: bool = False
    """DeepSpeed optimizer-state offload to CPU."""
    offload_params: bool = False
    """DeepSpeed parameter offload to CPU (ZeRO-3)."""
    zero3_gather_mb: float = 1024.0
    """ZeRO-3: parameters gathered at a time for the weight sync (MB of weights); no rank holds the whole model
    for it. Smaller lowers peak memory and costs more collectives."""
    pack_length: int = 4096
    """Tokens per packed row; must hold max prompt + max completion."""
    micro_batch_rows: int = 1
    """Packed rows per micro-batch (forward/backward pass)."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk when computing log-probs (never materialise full fp32 logits of a row)."""
    compile: bool = False
    """torch.compile each decoder layer (dynamic shapes) and the fused head's elementwise math on GPU: fuses
    norms, rotary, activations and the softmax passes into few kernels. First steps pay the compile time."""
    fused_head: bool = True
    """lm_head + log-softmax as one autograd function with a closed-form gradient (no logits kept for backward);
    False = autograd over checkpointed chunks. Entropy bonuses and ZeRO-3 always use the autograd path."""
    max_consecutive_skips: int = 5
    """Stop the run after this many optimizer steps in a row skipped for a non-finite loss or gradient."""
    attention: Literal["auto", "varlen", "mask"] = "auto"
    """Packed attention: `varlen` (position-id restarts / flash-attn varlen), `mask` (block-diagonal)."""
    lora_rank: int = 0
    """LoRA adapter rank r (0 = off: full fine-tuning). With r > 0 the learner wraps the model with `peft`: the base
    weights stay frozen in the model dtype, only the adapters train and get optimizer state, and weight syncs and
    checkpoints carry only the adapter (PEFT format; `rlvr export --merge` writes a merged model)."""
    lora_alpha: int = 16
    """LoRA scaling numerator: the adapter's output is multiplied by alpha / r (PEFT's `lora_alpha`)."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input (PEFT's `lora_dropout`). Keep 0 for RL: with dropout the learner's log-probs
    no longer match the engine's (the learner runs without dropout everywhere else)."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names (suffixes) that get adapters: by default the attention and MLP projections of Llama/Qwen-style
    models (what vLLM serves LoRA on)."""


@dataclass
class ClusterConfig:
    """Actors and their placement."""

    num_learners: int = 1
    """Data-parallel learner ranks (one GPU each on GPUs)."""
    num_engines: int = 1
    """Generation engine actors."""
    engine_tp: int = 1
    """Tensor-parallel GPUs per engine."""
    colocate: bool = False
    """Learners and engines share GPUs (CUDA IPC weight transfer, vLLM sleep/wake)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where actors run: `auto` = cuda when Ray reports GPUs."""
    address: str | None = None
    """Ray address to join (default: $RAY_ADDRESS, else start a local cluster)."""
    num_nodes: int = 1
    """Nodes expected in the cluster (for validating the GPU split before start)."""
    gpus_per_node: int = 0
    """GPUs per node expected (0 = unknown: the split is checked against Ray's report at start)."""
    cpus_per_actor: float = 1.0
    """Ray CPUs reserved per learner/engine actor (CPU runs)."""
    num_verifier_actors: int = 1
    """Ray actors each holding a verifier pool."""
    actor_timeout_s: float = 300.0
    """Seconds any single actor call may take before the run fails loudly."""
    heartbeat_timeout_s: float = 120.0
    """An engine with prompts outstanding and no generated token for this long is declared stuck."""
    max_engine_restarts: int = 3
    """Engines that die or hang are replaced (re-synced, their prompts re-queued) up to this many times."""
    max_restarts: int = 2
    """A learner failure restarts the whole run from the last complete checkpoint up to this many times."""


@dataclass
class EvalConfig:
    """In-training evaluation."""

    datasets: list[str] = field(default_factory=list)
    """Eval datasets (empty = the `split` of the training datasets, or a built-in task's held-out rows)."""
    split: str = "test"
    """Split of the eval data."""
    every_n_steps: int = 10
    """Evaluate every N training steps (0 = never)."""
    at_step_0: bool = True
    """Evaluate before training (the baseline for gains)."""
    num_samples: int = 1
    """Samples per eval prompt (k)."""
    greedy: bool = True
    """Greedy decoding for eval (otherwise the training temperature)."""
    max_prompts: int = 128
    """Eval prompts used (0 = all)."""
    overlap: bool = True
    """Generate eval prompts beside the next step's rollouts instead of pausing training for them; the next
    weight sync waits for the eval, so it still measures exactly the weights of its step."""


@dataclass
class EnvConfig:
    """Multi-turn environments and tools (docs/multi-turn.md): a routed row runs G episodes, not G completions."""

    name: str = ""
    """Environment for rows without an `env` column: a registered name (`tool`, `tool_lookup`, `math_python`) or
    an import path `pkg.module:Class`. Empty: only rows with an `env` column run episodes; the rest stay
    single-turn. A row's `env` column may name a registered environment or this name, never an import path of
    its own (the data does not choose code to import)."""
    params: dict[str, float | int | str | bool] = field(default_factory=dict)
    """Keyword arguments of the environment's factory (e.g. `verifier`, `instructions`)."""
    tools: list[str] = field(default_factory=list)
    """Tool names (`calculator`, `lookup`, `python`) or import paths `pkg.module:fn`; empty = the environment's
    own tool set."""
    tool_format: str = ""
    """Tool-call format: `qwen` (`<tool_call>{json}</tool_call>`), `compact` (`?KEY` -> `=VALUE`, for tiny
    models) or an import path `pkg.module:Class`; empty = the environment's default."""
    end_on_tool_error: bool = False
    """End an episode (reason `tool_error`) at its first failed tool call instead of showing the error."""
    tool_timeout_s: float = 5.0
    """Per-call time limit of a tool; the verifier pool kills a worker that outlives it by its grace."""
    max_turns: int = 4
    """Policy turns per episode (end reason `max_turns`)."""
    max_tokens_per_turn: int = 256
    """New tokens per policy turn (end reason `turn_length`)."""
    max_total_tokens: int = 2048
    """Prompt + every turn + every observation (end reason `max_total_tokens`); at most the model's context."""
    allow_unisolated_python: bool = False
    """Let the `python` tool run where the code sandbox has only its weakest level (`rlimits`: no network or
    filesystem isolation; README, Security and reliability). Off: an environment with the `python` tool is
    refused at start-up unless the sandbox isolates (`namespaces` or `userns`)."""


@dataclass
class CheckpointConfig:
    """Run directory and checkpoints."""

    output_dir: str = "runs"
    """Parent directory of run directories."""
    every_n_steps: int = 0
    """Save every N steps (0 = only at the end)."""
    keep_last: int = 2
    """Complete checkpoints kept."""
    resume: str = "auto"
    """`auto` (newest complete checkpoint of this run, if any), a checkpoint path, or `never`."""
    save_final: bool = True
    """Save a checkpoint when training ends."""
    min_free_gb: float = 1.0
    """Refuse to start when the output directory's disk has less free space than this (GB)."""


@dataclass
class LoggingConfig:
    """Console, files and wandb."""

    run_name: str | None = None
    """Run directory name under `checkpoint.output_dir` (default: rlvr-<timestamp>)."""
    console_progress: bool = True
    """Live progress line (step, reward, eval, tokens/s, ETA)."""
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""
    wandb_mode: Literal["off", "online", "offline"] = "off"
    """Weights & Biases logging."""
    wandb_project: str = "rlvr"
    """wandb project."""
    wandb_entity: str | None = None
    """wandb entity (team)."""
    samples_every_n_steps: int = 1
    """Write sampled completions to samples.jsonl every N steps (0 = never)."""
    wandb_table_every_n_steps: int = 25
    """Log a wandb table of sampled completions every N steps (0 = never); metrics go to wandb every step."""
    num_logged_samples: int = 4
    """Completions written per logging step."""


@dataclass
class ExperimentConfig:
    """A whole rlvr run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    num_steps: int = 100
    """Training steps (one rollout batch each)."""
    seed: int = 0
    """Global seed (model init, sampling, data order)."""
