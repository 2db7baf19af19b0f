"""Prompt accounting (docs/design.md, Prompt accounting): every prompt pulled from a dataset ends in exactly one counter.

Terminal states: trained, filtered (zero variance), dropped_stale, dropped_too_long, skipped_bad_row,
failed. A prompt between pull and its terminal state is `in_flight`. Invariant, checked every step and
across restarts: pulled == sum(terminal counters) + in_flight, and each prompt_id is terminal at most once.
The ledger is saved in checkpoints so a resumed run continues the same books; prompts in flight at the
checkpoint are re-queued by the driver on resume (not counted twice).
"""

from __future__ import annotations

from typing import Any

TERMINAL = ("trained", "filtered", "dropped_stale", "dropped_too_long", "skipped_bad_row", "failed")


class PromptLedger:
    """prompt_id -> terminal state, plus the ids in flight."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.in_flight: set[str] = set()
        self.extra_pulled: dict[str, int] = {"dropped_too_long": 0, "skipped_bad_row": 0}
        self.failure_reasons: dict[str, str] = {}

    def pull(self, prompt_id: str) -> None:
        if prompt_id in self.in_flight or prompt_id in self.state:
            raise AssertionError(f"prompt {prompt_id} pulled twice")
        self.in_flight.add(prompt_id)

    def finish(self, prompt_id: str, state: str, reason: str | None = None) -> None:
        assert state in TERMINAL, state
        if prompt_id not in self.in_flight:
            raise AssertionError(
                f"prompt {prompt_id} finished as {state} but was not in flight (already {self.state.get(prompt_id)!r})"
            )
        self.in_flight.remove(prompt_id)
        self.state[prompt_id] = state
        if reason:
            self.failure_reasons[prompt_id] = reason

    def reopen(self, prompt_id: str) -> None:
        """A filtered prompt that is trained after all (zero-advantage fallback) goes back in flight."""
        if self.state.get(prompt_id) != "filtered":
            raise AssertionError(f"prompt {prompt_id} reopened from state {self.state.get(prompt_id)!r}")
        del self.state[prompt_id]
        self.in_flight.add(prompt_id)

    def count_source_drops(self, dropped_too_long: int, skipped_bad_row: int) -> None:
        """Rows the prompt stream dropped before making requests (they never get a prompt_id in flight)."""
        self.extra_pulled["dropped_too_long"] = dropped_too_long
        self.extra_pulled["skipped_bad_row"] = skipped_bad_row

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in TERMINAL}
        for s in self.state.values():
            out[s] += 1
        for k, v in self.extra_pulled.items():
            out[k] += v
        out["in_flight"] = len(self.in_flight)
        out["pulled"] = len(self.state) + len(self.in_flight) + sum(self.extra_pulled.values())
        return out

    def check(self) -> None:
        c = self.counts()
        total = sum(c[k] for k in TERMINAL) + c["in_flight"]
        assert total == c["pulled"], f"prompt accounting broken: {c}"

    def metrics(self) -> dict[str, float]:
        return {f"data/prompts_{k}": float(v) for k, v in self.counts().items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": dict(self.state),
            "in_flight": sorted(self.in_flight),
            "extra_pulled": dict(self.extra_pulled),
            "failure_reasons": dict(self.failure_reasons),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.state = dict(d["state"])
        self.in_flight = set(d["in_flight"])
        self.extra_pulled = dict(d["extra_pulled"])
        self.failure_reasons = dict(d.get("failure_reasons", {}))


def source_drops(stream: Any) -> dict[str, int]:
    """The prompt stream's own drop counters, as `PromptLedger.count_source_drops` takes them."""
    c = getattr(stream, "counters", {}) or {}
    return {"dropped_too_long": int(c.get("dropped_too_long", 0)), "skipped_bad_row": int(c.get("skipped_bad_row", 0))}
