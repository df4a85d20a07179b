import signal
import time

import pytest

from celerity_jax.train import interrupts


def _wait_for(proc, ready, timeout=300):
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
        time.sleep(0.02)


@pytest.mark.parametrize("moment", ["started", "locked", "planned"])
def test_ctrl_c_during_startup_exits_cleanly_without_a_checkpoint(tmp_path, moment, celerity_train):
    workdir = tmp_path / "run"
    proc = celerity_train(workdir)
    ready = {
        "started": lambda: time.sleep(1.0) or True,  # while JAX starts and the modules import
        "locked": lambda: (workdir / "run.lock").exists() and (workdir / "run.lock").read_text(),  # data, compile
        "planned": lambda: (workdir / "plan.json").exists(),  # the initial state compiles
    }[moment]
    _wait_for(proc, ready)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    assert "Traceback" not in out and "Exception ignored" not in out, out
    assert proc.returncode == interrupts.EXIT_CODE, out
    if "interrupted: saved a checkpoint" not in out:  # else the first step came first: the loop saved
        assert "interrupted before the first step: nothing was saved" in out
        assert not (workdir / "checkpoints").exists() or not list((workdir / "checkpoints").iterdir())


def test_a_second_ctrl_c_exits_at_once(tmp_path, celerity_train):
    workdir = tmp_path / "run"
    proc = celerity_train(workdir)
    _wait_for(proc, lambda: (workdir / "run.lock").exists() and (workdir / "run.lock").read_text())
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == interrupts.EXIT_CODE, out
    assert "Traceback" not in out


def test_the_flag_is_cleared_when_the_outermost_block_ends():
    with interrupts.handled():
        with interrupts.handled():
            signal.raise_signal(signal.SIGINT)
            assert interrupts.requested()
        assert interrupts.requested()
        with pytest.raises(interrupts.Interrupted):
            interrupts.raise_if_requested()
    assert not interrupts.requested()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
