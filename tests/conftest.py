"""Shared fixtures: one local Ray cluster per test session, started on first use and shared."""

from __future__ import annotations

import os

import pytest

# Ray 2.60 turns token authentication on for a head whenever ~/.ray/auth_token exists, and a process that
# starts a cluster while another regenerates the token can end up with a GCS its client cannot join. The test
# session runs every Ray cluster (in-process, `rlvr train` subprocesses, ray_node_setup.sh nodes) without
# tokens; tests that exercise token mode set RAY_AUTH_MODE themselves.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (8 logical CPUs) shared by every test that needs Ray; its address is exported so
    that `rlvr train` subprocesses join it instead of starting their own."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=8,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        )
    address = ray.get_runtime_context().gcs_address
    old = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = address
    yield address
    if old is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = old
    ray.shutdown()
