"""A tool that never returns, for tests/orchestration/test_collector_episodes.py. Its own module, without heavy
imports: a verifier worker imports it inside a job (under the job's time limit), and importing the test module
there would import torch."""


def spin() -> str:
    """Never returns, holding the GIL (loaded by the pool's workers as `hung_tools:spin`)."""
    while True:
        pass
