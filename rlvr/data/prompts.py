"""Prompt rendering, the training prompt stream (weighted mixer, epochs, resumable) and eval requests.

Invariants (docs/design.md, Records and Prompt accounting):
- `prompt_id` = make_prompt_id(dataset, row, epoch), where epoch is the pass over that dataset; ids are
  stable across restarts (row = position in the source, bad rows included).
- Every pull ends in exactly one of the stream's outcomes: returned as a request, `dropped_too_long` or
  `skipped_bad_row`; `counters["pulled"]` = requests returned + both drop counts, at all times.
- The order is a pure function of (config, number of pulls so far): the mixer draws its uniform number from
  a hash of (shuffle_seed, pull index) and each dataset's permutation from a hash of (shuffle_seed + epoch,
  dataset), so `state_dict()` (pull count, per-dataset cursors, counters) restores the exact continuation.
- Mixer: with `data.weights` a dataset is drawn with probability proportional to its weight and restarts its
  own permutation (next epoch) when exhausted; without weights the draw is proportional to the rows left in
  the current epoch, which is a uniform shuffle of all datasets together. Either way the stream ends after
  `num_epochs` x (total rows) pulls.
- Per-prompt sampling seeds are a stable hash of (cfg.seed, prompt_id): the same prompt gets the same seed
  in every run and after every restart.
- A request's metadata carries the row's raw prompt under private keys (`ROW_PROMPT`: the prompt text, or for a
  messages row the last user message's content; `ROW_MESSAGES`: the row's messages, or None), never rendered: an
  episode's first observation renders it itself, exactly once (the rendered `prompt_text` is not the prompt).
- A prompt of more than `max_prompt_tokens * CHARS_PER_TOKEN_LIMIT` characters cannot fit (no tokenizer packs
  that many characters into a token) and is dropped as too long before it is rendered or tokenized, with a
  warning naming its row: tokenizing a giant row whole would cost memory out of all proportion.
"""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path
from typing import Any

from rlvr.config.sections import DataConfig, ExperimentConfig, ModelConfig
from rlvr.data.sources import BadRow, DataError, LoadedDataset, dataset_name, load_dataset_rows
from rlvr.types import PromptRequest, SamplingParams, make_prompt_id

logger = logging.getLogger(__name__)

_STATE_VERSION = 1
CHARS_PER_TOKEN_LIMIT = 32
"""Characters per token above which a prompt is too long without tokenizing it (real tokenizers: 3-6)."""


ROW_PROMPT = "_rlvr_prompt"
"""Request metadata key of the row's raw prompt text (module docstring; `_rlvr` keys are never data columns)."""
ROW_MESSAGES = "_rlvr_messages"
"""Request metadata key of the row's raw messages (None for a prompt row)."""


def raw_prompt(row: dict[str, Any]) -> str:
    """A normalised row's prompt as text, unrendered: the prompt column, or the last user message's content."""
    if row.get("messages") is None:
        return str(row["prompt"])
    users = [m for m in row["messages"] if m.get("role") == "user"]
    return str((users or row["messages"])[-1].get("content") or "")


def prompt_chars(row: dict[str, Any], data_cfg: DataConfig) -> int:
    """Characters of a normalised row's prompt text (messages or prompt, plus the system prompt)."""
    if row.get("messages") is not None:
        body = sum(len(m.get("content") or "") for m in row["messages"])
    else:
        body = len(row.get("prompt") or "")
    return body + len(data_cfg.system_prompt or "")


def too_many_chars(row: dict[str, Any], data_cfg: DataConfig) -> str | None:
    """The reason a row's prompt cannot fit `max_prompt_tokens` judged by its length alone, else None."""
    limit = data_cfg.max_prompt_tokens * CHARS_PER_TOKEN_LIMIT
    n = prompt_chars(row, data_cfg)
    if n > limit:
        return (
            f"prompt of {n} characters cannot fit --data.max-prompt-tokens {data_cfg.max_prompt_tokens} "
            f"(more than {CHARS_PER_TOKEN_LIMIT} characters per token); not tokenized"
        )
    return None


def stable_int(*parts: object, bits: int = 63) -> int:
    """A non-negative integer hash of `parts` that is the same in every process (sha256, not hash())."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - bits)


def prompt_seed(seed: int, prompt_id: str) -> int:
    """Deterministic sampling seed of one prompt (31 bits: fits every engine's seed type)."""
    return stable_int("sampling", seed, prompt_id, bits=31)


def _messages(row: dict[str, Any], data_cfg: DataConfig) -> list[dict[str, str]]:
    if row.get("messages") is not None:
        messages = list(row["messages"])
    else:
        messages = [{"role": "user", "content": row["prompt"]}]
    if data_cfg.system_prompt and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": data_cfg.system_prompt})
    return messages


def render_prompt(row: dict[str, Any], tokenizer: Any, data_cfg: DataConfig) -> tuple[str, list[int]]:
    """The prompt text and token ids of a normalised row.

    With `apply_chat_template` and a tokenizer that has a template: system prompt + messages through the chat
    template with the generation prompt appended (the template carries any BOS). Otherwise raw text: system
    prompt + "\\n" + prompt (message contents joined by "\\n"), tokenized with the tokenizer's special tokens.
    """
    if data_cfg.apply_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(_messages(row, data_cfg), tokenize=False, add_generation_prompt=True)
        return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if row.get("messages") is not None:
        body = "\n".join(m["content"] for m in row["messages"])
    else:
        body = row["prompt"]
    text = f"{data_cfg.system_prompt}\n{body}" if data_cfg.system_prompt else body
    return text, list(tokenizer(text)["input_ids"])


def apply_chat_template_override(tokenizer: Any, model_cfg: ModelConfig) -> None:
    """Set `model.chat_template` (a file path or the template text) on the tokenizer, if configured."""
    template = model_cfg.chat_template
    if not template:
        return
    path = Path(template).expanduser()
    if "{" not in template and path.is_file():
        template = path.read_text(encoding="utf-8")
    elif "{" not in template:
        raise ValueError(f"model.chat_template {template!r} is neither an existing file nor Jinja template text")
    tokenizer.chat_template = template


def _sampling(cfg: ExperimentConfig, prompt_id: str, temperature: float) -> SamplingParams:
    return SamplingParams.from_config(cfg.generation, seed=prompt_seed(cfg.seed, prompt_id), temperature=temperature)


def _request(
    cfg: ExperimentConfig,
    row: dict[str, Any],
    prompt_id: str,
    text: str,
    ids: list[int],
    *,
    num_samples: int,
    temperature: float,
    is_eval: bool,
) -> PromptRequest:
    metadata = dict(row.get("extra") or {})
    metadata.update(
        ground_truth=row["ground_truth"],
        verifier=row["verifier"],
        dataset=row["dataset"],
        row=row["row"],
        prompt_text=text,
    )
    metadata[ROW_PROMPT] = raw_prompt(row)
    metadata[ROW_MESSAGES] = list(row["messages"]) if row.get("messages") is not None else None
    metadata[cfg.rewards.verifier_column] = row["verifier"]  # the scorer routes on this key
    return PromptRequest(
        prompt_id=prompt_id,
        prompt_token_ids=ids,
        num_samples=num_samples,
        sampling=_sampling(cfg, prompt_id, temperature),
        metadata=metadata,
        is_eval=is_eval,
        prompt_text=text,
    )


class PromptStream:
    """Training prompts as `PromptRequest`s: weighted mix of datasets, seeded shuffles, epochs, resumable."""

    def __init__(self, cfg: ExperimentConfig, tokenizer: Any, known_verifiers: set[str] | None = None) -> None:
        if not cfg.data.datasets:
            raise ValueError("data.datasets is empty: name at least one dataset (e.g. builtin:copy)")
        self._cfg = cfg
        self._tokenizer = tokenizer
        self._datasets: list[LoadedDataset] = []
        errors: list[str] = []
        for spec in cfg.data.datasets:
            try:
                self._datasets.append(load_dataset_rows(spec, cfg, cfg.data.split, known_verifiers))
            except ValueError as e:  # collect every dataset's problems before stopping
                errors.append(str(e))
        if errors:
            raise DataError("\n".join(errors))
        names = [d.name for d in self._datasets]
        if len(set(names)) != len(names):
            raise ValueError(f"datasets must have distinct names (prompt ids use them), got {names}")
        weights = cfg.data.weights
        if weights and (len(weights) != len(names) or any(w < 0 for w in weights) or sum(weights) <= 0):
            raise ValueError(f"data.weights needs one non-negative weight per dataset ({len(names)}), got {weights}")
        self._weights: list[float] | None = [float(w) for w in weights] if weights else None
        # Per dataset: entries in source order, each a normalised row or a BadRow placeholder.
        self._entries: list[list[dict[str, Any] | BadRow]] = []
        for d in self._datasets:
            by_row: dict[int, dict[str, Any] | BadRow] = {r["row"]: r for r in d.rows}
            by_row.update({b.row: b for b in d.bad_rows})
            self._entries.append([by_row[k] for k in sorted(by_row)])
        self._num_total = sum(len(e) for e in self._entries)
        self._limit = cfg.data.num_epochs * self._num_total
        self._num_pulled = 0
        self._cursors = [[0, 0] for _ in self._entries]  # [epoch, position in that epoch's permutation]
        self._counters = {"pulled": 0, "dropped_too_long": 0, "skipped_bad_row": 0}
        self._dropped: list[tuple[str, str]] = []
        self._perm_cache: dict[tuple[int, int], list[int]] = {}

    @property
    def counters(self) -> dict[str, int]:
        """`pulled` (requests returned + drops), `dropped_too_long`, `skipped_bad_row`."""
        return dict(self._counters)

    @property
    def dataset_names(self) -> list[str]:
        return [d.name for d in self._datasets]

    @property
    def num_rows(self) -> int:
        """Rows over all datasets (one epoch), bad rows included."""
        return self._num_total

    @property
    def epoch(self) -> int:
        """Completed passes over the data (the number of epochs started, minus one, for the first)."""
        return self._num_pulled // max(self._num_total, 1)

    def pop_dropped(self) -> list[tuple[str, str]]:
        """(prompt_id, counter name) of every pull dropped since the last call (for per-id accounting)."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def _permutation(self, i: int, epoch: int) -> list[int]:
        key = (i, epoch)
        if key not in self._perm_cache:
            if len(self._perm_cache) > 2 * len(self._entries):
                self._perm_cache.clear()
            order = list(range(len(self._entries[i])))
            seed = stable_int("shuffle", self._cfg.data.shuffle_seed + epoch, self._datasets[i].name)
            random.Random(seed).shuffle(order)
            self._perm_cache[key] = order
        return self._perm_cache[key]

    def _choose_dataset(self) -> int:
        u = stable_int("mix", self._cfg.data.shuffle_seed, self._num_pulled) / 2**63
        if self._weights is None:
            masses = [len(e) - pos for e, (_, pos) in zip(self._entries, self._cursors)]
            if sum(masses) == 0:  # epoch over for every dataset together
                for c in self._cursors:
                    c[0] += 1
                    c[1] = 0
                masses = [len(e) for e in self._entries]
        else:
            masses = list(self._weights)
        target = u * sum(masses)
        acc = 0.0
        for i, m in enumerate(masses):
            acc += m
            if m > 0 and target < acc:
                return i
        return max(i for i, m in enumerate(masses) if m > 0)

    def _pull(self) -> tuple[str, dict[str, Any] | BadRow]:
        i = self._choose_dataset()
        cursor = self._cursors[i]
        if cursor[1] >= len(self._entries[i]):  # weighted mode: this dataset starts its next epoch
            cursor[0] += 1
            cursor[1] = 0
        entry = self._entries[i][self._permutation(i, cursor[0])[cursor[1]]]
        cursor[1] += 1
        self._num_pulled += 1
        self._counters["pulled"] += 1
        row = entry.row if isinstance(entry, BadRow) else entry["row"]
        return make_prompt_id(self._datasets[i].name, row, cursor[0]), entry

    def next_request(self) -> PromptRequest | None:
        """The next training request, or None when `num_epochs` passes are done."""
        while self._num_pulled < self._limit:
            prompt_id, entry = self._pull()
            if isinstance(entry, BadRow):
                self._counters["skipped_bad_row"] += 1
                self._dropped.append((prompt_id, "skipped_bad_row"))
                continue
            reason = too_many_chars(entry, self._cfg.data)
            if reason:
                self._counters["dropped_too_long"] += 1
                self._dropped.append((prompt_id, "dropped_too_long"))
                logger.warning("dropping %s (%s row %s): %s", prompt_id, entry["dataset"], entry["row"], reason)
                continue
            text, ids = render_prompt(entry, self._tokenizer, self._cfg.data)
            if len(ids) > self._cfg.data.max_prompt_tokens:
                self._counters["dropped_too_long"] += 1
                self._dropped.append((prompt_id, "dropped_too_long"))
                logger.debug(
                    "dropping %s: %d prompt tokens > %d", prompt_id, len(ids), self._cfg.data.max_prompt_tokens
                )
                continue
            return _request(
                self._cfg,
                entry,
                prompt_id,
                text,
                ids,
                num_samples=self._cfg.generation.num_samples,
                temperature=self._cfg.generation.temperature,
                is_eval=False,
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: pulls so far, per-dataset [epoch, position], counters."""
        return {
            "version": _STATE_VERSION,
            "num_pulled": self._num_pulled,
            "cursors": [list(c) for c in self._cursors],
            "counters": dict(self._counters),
            "datasets": [[d.name, len(e)] for d, e in zip(self._datasets, self._entries)],
            "shuffle_seed": self._cfg.data.shuffle_seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by `state_dict` (the datasets must be the same)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"prompt stream state version {state.get('version')} != {_STATE_VERSION}")
        saved = [tuple(x) for x in state["datasets"]]
        current = [(d.name, len(e)) for d, e in zip(self._datasets, self._entries)]
        if saved != current:
            raise ValueError(
                f"cannot resume the prompt stream: it was saved over datasets {saved} (name, rows) but the "
                f"config now gives {current}; resume with the same data or start a new run"
            )
        self._num_pulled = int(state["num_pulled"])
        self._cursors = [[int(a), int(b)] for a, b in state["cursors"]]
        self._counters = {k: int(v) for k, v in state["counters"].items()}
        self._dropped = []


def eval_requests(
    cfg: ExperimentConfig, tokenizer: Any, known_verifiers: set[str] | None = None
) -> list[PromptRequest]:
    """Eval requests: `eval.datasets`, else the `eval.split` of each training dataset (built-in tasks: their
    held-out test split). Up to `eval.max_prompts` (0 = all), interleaved across datasets in source order;
    `is_eval=True`, `eval.num_samples` samples, temperature 0.0 (greedy) when `eval.greedy`.

    Prompt ids are `eval/<dataset>:<row>:0`, never equal to a training prompt id. Too-long prompts are
    dropped (logged); a training file with no separate eval split is skipped with a warning.
    """
    specs = list(cfg.eval.datasets)
    split = cfg.eval.split
    if not specs:
        specs = [s for s in cfg.data.datasets if _has_split(s)]
        skipped = [s for s in cfg.data.datasets if s not in specs]
        if skipped:
            logger.warning("no eval split for %s (local files have none); set eval.datasets to evaluate them", skipped)
    temperature = 0.0 if cfg.eval.greedy else cfg.generation.temperature
    per_dataset: list[list[PromptRequest]] = []
    names: dict[str, str] = {}
    for spec in specs:
        loaded = load_dataset_rows(spec, cfg, split, known_verifiers)
        if loaded.name in names:  # eval prompt ids (eval/<name>:<row>) would collide and mix their samples
            raise ValueError(
                f"eval datasets {names[loaded.name]!r} and {spec!r} have the same name "
                f"{loaded.name!r} (eval prompt ids use it): rename one of the files"
            )
        names[loaded.name] = spec
        reqs: list[PromptRequest] = []
        num_too_long = 0
        for row in loaded.rows:
            reason = too_many_chars(row, cfg.data)
            if reason:
                num_too_long += 1
                logger.warning("eval %s row %s: %s", spec, row["row"], reason)
                continue
            text, ids = render_prompt(row, tokenizer, cfg.data)
            if len(ids) > cfg.data.max_prompt_tokens:
                num_too_long += 1
                continue
            prompt_id = make_prompt_id(f"eval/{loaded.name}", row["row"], 0)
            reqs.append(
                _request(
                    cfg,
                    row,
                    prompt_id,
                    text,
                    ids,
                    num_samples=cfg.eval.num_samples,
                    temperature=temperature,
                    is_eval=True,
                )
            )
        if num_too_long:
            logger.warning(
                "eval %s: dropped %d prompt(s) longer than %d tokens", spec, num_too_long, cfg.data.max_prompt_tokens
            )
        per_dataset.append(reqs)
    out: list[PromptRequest] = []
    for k in range(max((len(r) for r in per_dataset), default=0)):
        out.extend(r[k] for r in per_dataset if k < len(r))
    return out[: cfg.eval.max_prompts] if cfg.eval.max_prompts > 0 else out


def _has_split(spec: str) -> bool:
    """Whether a training spec has named splits (built-in tasks, hub names, save_to_disk DatasetDicts)."""
    return dataset_name(spec) == spec or (Path(spec) / "dataset_dict.json").is_file()
