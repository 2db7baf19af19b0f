"""Prompt requests as JSON data, for the driver state in a checkpoint (the requests re-queued on resume).

Invariant: `request_from_json(request_to_json(r)) == r` for every request whose metadata JSON can hold;
other metadata values (rare: bytes or dates from a Parquet column) come back as their str().
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rlvr.types import PromptRequest, SamplingParams


def request_to_json(r: PromptRequest) -> dict[str, Any]:
    """A prompt request as JSON data (module docstring)."""
    return json.loads(json.dumps(dataclasses.asdict(r), default=str))


def request_from_json(d: dict[str, Any]) -> PromptRequest:
    """The request `request_to_json` wrote; ValueError for fields a request does not have."""
    fields = {f.name for f in dataclasses.fields(PromptRequest)}
    if not isinstance(d, dict) or set(d) - fields:
        raise ValueError(f"unexpected fields {sorted(set(d) - fields) if isinstance(d, dict) else type(d).__name__}")
    return PromptRequest(**{**d, "sampling": SamplingParams(**d.get("sampling", {}))})
