"""The search's compiles: the most urgent first, a compile that raises as a result, no worker outliving it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from celerity_jax.aot import workers
from celerity_jax.aot.compile import UpdatePiece
from celerity_jax.errors import ConfigError


def test_the_most_urgent_compile_runs_first_and_a_config_error_comes_back_as_a_result(monkeypatch):
    ran = []

    def fake_run(task):
        ran.append(task.setting)
        if task.setting == "step":
            raise ConfigError("the batch does not split")
        return {"ran": task.setting}

    monkeypatch.setattr(workers, "run_task", fake_run)
    compiler = workers.Compiler(1, failed=lambda setting, e: {"setting": setting, "error": str(e)})
    compiler.submit(workers.PieceTask(None, "v5e-4", "piece", None, UpdatePiece()), "tag a")
    compiler.submit(workers.StepTask(None, "v5e-4", "estimate", None, "fits"), "tag b")
    compiler.submit(workers.StepTask(None, "v5e-4", "step", None, "never"), "tag c")
    results = [compiler.next(timeout=1) for _ in range(3)]
    assert ran == ["step", "estimate", "piece"] and compiler.running == 0
    assert results[0] == ("tag c", {"setting": "step", "error": "the batch does not split"})
    assert results[1] == ("tag b", {"ran": "estimate"})
    compiler.close(stop=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_workers_busy_compiling_end_with_a_search_killed_outright():
    search = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, time
        from celerity_jax.aot import workers

        if __name__ == "__main__":
            compiler = workers.Compiler(2, failed=None)
            busy = [compiler.pool.apply_async(time.sleep, (300,)) for _ in range(2)]  # a long compile each
            print(*[p.pid for p in compiler.pool._pool], flush=True)
            time.sleep(300)
        """)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in search.stdout.readline().split()]
    try:
        time.sleep(1)  # the sleeps have started
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        search.send_signal(signal.SIGKILL)
        search.wait()
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in pids)
    finally:
        search.kill()
        for pid in filter(_alive, pids):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
