"""Registers the built-in tasks' verifiers (rlvr.data.tasks) with the reward registry: `copy`."""

from rlvr.data.tasks import COPY_VERIFIER, copy_reward
from rlvr.rewards.registration import register_reward

register_reward(COPY_VERIFIER)(copy_reward)
