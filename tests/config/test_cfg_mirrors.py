"""The settings the algorithms, rewards and engines take are built from the config sections, one source of defaults.

`LossConfig` / `ShapingConfig` (rlvr.algorithms), `RewardsSettings` (rlvr.rewards) and `SamplingParams`
(rlvr.types) carry some fields of a config section under the same names: every shared default must equal the
section's (they read it from the section), and `from_config` must carry every shared value across.
"""

from __future__ import annotations

import dataclasses

import pytest

from rlvr.algorithms.losses import LossConfig
from rlvr.algorithms.shaping import ShapingConfig
from rlvr.config import AlgorithmConfig, GenerationConfig, RewardsConfig, default_config
from rlvr.rewards.scorer import RewardsSettings
from rlvr.types import SamplingParams

PAIRS = [
    (LossConfig, AlgorithmConfig),
    (ShapingConfig, AlgorithmConfig),
    (RewardsSettings, RewardsConfig),
    (SamplingParams, GenerationConfig),
]


def _defaults(cls: type) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize(("mirror", "section"), PAIRS, ids=lambda c: c.__name__)
def test_shared_defaults_equal_the_config_section(mirror: type, section: type) -> None:
    mine, theirs = _defaults(mirror), _defaults(section)
    shared = sorted(set(mine) & set(theirs) - {"functions"})  # RewardsSettings.functions holds specs, not configs
    assert len(shared) >= 4, f"{mirror.__name__} shares almost no field with {section.__name__}"
    assert {k: mine[k] for k in shared} == {k: theirs[k] for k in shared}


def test_from_config_carries_every_shared_field() -> None:
    cfg = default_config()
    a = dataclasses.replace(
        cfg.algorithm,
        loss="grpo",
        clip_eps_low=0.1,
        clip_eps_high=0.3,
        clip_delta=3.0,
        kl_beta=0.05,
        kl_estimator="k2",
        entropy_coef=0.01,
        overlong_buffer=4,
        overlong_penalty=0.5,
        non_stop_penalty=-1.0,
    )
    loss = LossConfig.from_config(a, max_completion_length=32)
    assert {f.name: getattr(loss, f.name) for f in dataclasses.fields(loss) if f.name != "max_completion_length"} == {
        f.name: getattr(a, f.name) for f in dataclasses.fields(loss) if f.name != "max_completion_length"
    }
    assert loss.max_completion_length == 32
    shaping = ShapingConfig.from_config(a, 32)
    assert (
        shaping.max_completion_length,
        shaping.overlong_buffer,
        shaping.overlong_penalty,
        shaping.non_stop_penalty,
        shaping.mask_truncated,
    ) == (32, 4, 0.5, -1.0, False)
    g = dataclasses.replace(
        cfg.generation, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=7, stop_strings=["</a>"], stop_token_ids=[3]
    )
    sp = SamplingParams.from_config(g, seed=11, temperature=0.0)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, sp.stop_strings, sp.stop_token_ids, sp.seed) == (
        0.0,
        0.9,
        5,
        7,
        ["</a>"],
        [3],
        11,
    )
    assert sp.stop_strings is not g.stop_strings  # a copy: a request never aliases the config
    r = dataclasses.replace(
        cfg.rewards, verifier_column="v", num_workers=3, timeout_s=2.5, max_queue=7, primary="math", custom=["pkg.mod"]
    )
    s = RewardsSettings.from_config(r)
    assert (s.verifier_column, s.num_workers, s.timeout_s, s.max_queue, s.primary, s.custom) == (
        "v",
        3,
        2.5,
        7,
        "math",
        ["pkg.mod"],
    )
