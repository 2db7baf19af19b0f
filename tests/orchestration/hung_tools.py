"""A tool that never returns, for tests/orchestration/test_collector_episodes.py. Its own module, without heavy
imports: a verifier worker imports it inside a job (under the job's time limit), and importing the test module
there would import torch."""


def spin() -> str:
    """Never returns, holding the GIL (loaded by the pool's workers as `hung_tools:spin`)."""
    while True:
        pass


def block(seconds: float = 120.0) -> str:
    """Sleeps `seconds`, or until its parent process (a verifier worker's pool owner) is gone."""
    import os
    import time

    parent, end = os.getppid(), time.monotonic() + seconds
    while time.monotonic() < end and os.getppid() == parent:
        time.sleep(0.05)
    return "unblocked"


def wait_for(path: str, seconds: float = 120.0) -> str:
    """Returns once `path` exists (a test's gate over a pool worker), at most after `seconds`."""
    import os
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end and not os.path.exists(path):
        time.sleep(0.02)
    return "released"
