"""Verifiable rewards: verifiers, shaping rewards, the registry, the composite scorer and the verifier pool.

Invariant: importing `rlvr.rewards` is cheap (no math-verify/sympy, no ray/vllm/deepspeed/wandb/torch).
See registry.py for the reward-function contract and scorer.py for how scores combine.
"""

from rlvr.rewards.registry import get_reward, import_custom, known_rewards, register_reward
from rlvr.rewards.scorer import RewardFunctionSpec, RewardScorer, RewardsSettings

__all__ = [
    "RewardFunctionSpec",
    "RewardScorer",
    "RewardsSettings",
    "get_reward",
    "import_custom",
    "known_rewards",
    "register_reward",
]
