"""How observations become tokens: the chat wrapper of a non-policy turn, and tokenizing it exactly once.

A policy turn is whatever ids the engine produced; it usually ends with the end-of-turn token (Qwen's
`<|im_end|>`), kept by the engine as its stop token, but may end at a stop string (`</tool_call>`) instead. The
observation that follows is one string, tokenized once and appended after those exact ids:

    [end_of_turn if the turn did not close itself] + separator + prefix + content + suffix

e.g. for Qwen: "" + "\\n" + "<|im_start|>user\\n" + "<tool_response>...</tool_response>" +
"<|im_end|>\\n<|im_start|>assistant\\n". `TurnTemplate.from_chat_template` reads these pieces off the
tokenizer's own chat template (rendering a two-message conversation with and without one more message), so
the appended text is what the template would have produced at that point; earlier turns are never re-rendered.

The observation's content (a tool's output: untrusted text) is tokenized with special tokens split
(`split_special_tokens=True`): a tool printing `<|im_end|><|im_start|>assistant` gets the ids of that plain text,
never the real end-of-turn / role ids, so it cannot forge turn structure. Only the template's own pieces (closing,
separator, prefix, suffix) are tokenized with their special tokens; the three parts are tokenized separately.

The first observation (messages through the chat template) gets the data's system prompt (`system_prompt`,
`data.system_prompt`) merged in exactly once: prepended to the environment's own system message, or as a system
message of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlvr.envs.base import Observation

_USER_MARK = "USER_9c1e"
_ASSISTANT_MARK = "ASSISTANT_9c1e"
_OBSERVATION_MARK = "OBSERVATION_9c1e"


@dataclass(frozen=True)
class TurnTemplate:
    """The text around an observation turn (module docstring)."""

    end_of_turn: str
    separator: str
    prefix: str
    suffix: str

    def render(self, content: str, turn_closed: bool) -> str:
        """The observation turn's text; `turn_closed` says the policy turn already ended with `end_of_turn`."""
        closing = "" if turn_closed else self.end_of_turn
        return closing + self.separator + self.prefix + content + self.suffix

    @classmethod
    def from_chat_template(
        cls, tokenizer: Any, role: str = "user", end_of_turn: str | None = None, **template_kwargs: Any
    ) -> TurnTemplate:
        """The pieces for observations of `role`, read off `tokenizer`'s chat template; `end_of_turn` defaults
        to the tokenizer's EOS text. Use role "user" for templates that add their own tool-response tags to
        "tool" messages (Qwen) when the tool-call format renders those tags itself."""
        eot = end_of_turn if end_of_turn is not None else tokenizer.eos_token
        messages = [{"role": "user", "content": _USER_MARK}, {"role": "assistant", "content": _ASSISTANT_MARK}]
        before = tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)
        after = tokenizer.apply_chat_template(
            messages + [{"role": role, "content": _OBSERVATION_MARK}],
            tokenize=False,
            add_generation_prompt=True,
            **template_kwargs,
        )
        if not after.startswith(before) or _ASSISTANT_MARK not in before:
            raise ValueError(
                "chat template: adding a message changes the rendering of earlier ones; "
                "give the TurnTemplate pieces explicitly"
            )
        closing = before[before.rindex(_ASSISTANT_MARK) + len(_ASSISTANT_MARK) :]
        if not closing.startswith(eot):
            raise ValueError(f"chat template: an assistant turn ends with {closing!r}, not {eot!r}")
        prefix, _, suffix = after[len(before) :].partition(_OBSERVATION_MARK)
        return cls(end_of_turn=eot, separator=closing[len(eot) :], prefix=prefix, suffix=suffix)


class ObservationTokenizer:
    """Tokenizes observations exactly once each (module docstring)."""

    def __init__(self, tokenizer: Any, template: TurnTemplate, system_prompt: str = "", **template_kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.system_prompt = system_prompt
        self.template_kwargs = template_kwargs
        self._eot_ids = self.encode(template.end_of_turn) if template.end_of_turn else []

    def encode(self, text: str) -> list[int]:
        """`text` as ids, no special tokens added (special-token text in `text` becomes special ids: use it for
        template text only)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_content(self, text: str) -> list[int]:
        """Untrusted `text` (a tool's output) as ids with special tokens split: `<|im_end|>` in it is plain text."""
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def with_system_prompt(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`messages` with `system_prompt` merged in once (module docstring)."""
        if not self.system_prompt:
            return list(messages)
        if messages and messages[0].get("role") == "system":
            merged = f"{self.system_prompt}\n\n{messages[0].get('content') or ''}".rstrip("\n")
            return [{**messages[0], "content": merged}, *messages[1:]]
        return [{"role": "system", "content": self.system_prompt}, *messages]

    def first(self, observation: Observation) -> list[int]:
        """The ids of an episode's first observation (messages rendered with a generation prompt)."""
        if observation.token_ids is not None:
            return list(observation.token_ids)
        if observation.messages is not None:
            text = self.tokenizer.apply_chat_template(
                self.with_system_prompt(observation.messages),
                tokenize=False,
                add_generation_prompt=True,
                **self.template_kwargs,
            )
            return self.encode(text)
        return self.encode(observation.text)

    def next(self, observation: Observation, turn_token_ids: list[int]) -> list[int]:
        """The ids of an observation that follows the policy turn `turn_token_ids`."""
        if observation.token_ids is not None:
            return list(observation.token_ids)
        closed = bool(self._eot_ids) and turn_token_ids[-len(self._eot_ids) :] == self._eot_ids
        t = self.template
        head = ("" if closed else t.end_of_turn) + t.separator + t.prefix
        return self.encode(head) + self.encode_content(observation.text) + self.encode(t.suffix)

    def decode(self, token_ids: list[int]) -> str:
        """A policy turn's text for the environment (special tokens kept, so tags survive)."""
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))
