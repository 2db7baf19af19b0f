"""A SIGTERM that lands while the driver connects to Ray (`ray.init` inside `handlers_kept`) reaches rlvr's own
handler, not the absl failure signal handler Ray's core worker installs (which printed "*** SIGTERM received" and
ended the driver with exit -6 instead of 75: seen in the signal stress test under load). Ray reads its switch for
that handler from a constant fixed at `import ray`, so the environment variable alone came too late. A real local
Ray head; the driver runs in a subprocess so its signals and Ray stay out of the test process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    import ray  # imported before the handlers are kept, as in `rlvr train`
    from rlvr.launch.local_cluster import LocalRayHead
    from rlvr.orchestration.health import StopSignals, handlers_kept

    head = LocalRayHead(num_cpus=1, include_dashboard=False, own_session=True).start()
    try:
        with StopSignals() as signals:
            with handlers_kept(signals):
                ray.init(address=head.address, log_to_driver=False, logging_level="ERROR")
                os.kill(os.getpid(), signal.SIGTERM)  # what ray.init left in place handles it
                time.sleep(0.5)
            print("requested", signals.requested, flush=True)
            ray.shutdown()
    finally:
        head.stop()
    print("clean exit", flush=True)
    """
)


@pytest.mark.timeout(240)
def test_sigterm_during_ray_init_reaches_rlvrs_handler(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER")}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=200, env=env, cwd=tmp_path
    )
    assert "SIGTERM received at time" not in proc.stderr, proc.stderr[-2000:]  # absl's handler ran
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "requested SIGTERM" in proc.stdout and "clean exit" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
