"""Test settings (set before JAX is imported), the fixtures of the tests that train the tiny run, and a fake
trainer for the tests of its callers."""

import csv
import json
import os
import subprocess
import sys

import pytest

# Tests compile many small programs, in this process and in the subprocesses they start (which inherit
# the environment); compilation dominates their time. Set before JAX is imported:
# - a persistent compilation cache makes repeated compilations cheap;
# - the lowest backend optimization level, without fusion emitters, compiles about 2x faster (these
#   programs are tiny).
# - JAX on the CPU even where libtpu or the CUDA plugin is installed (the compile tests use them compile-only).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CACHE = os.path.join(REPO_ROOT, ".jax_cache")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

# The smallest tiny model with the test overrides: a few dozen steps.
TINY_GIN = (os.path.join(REPO_ROOT, "experiments/tiny/d48.gin"), os.path.join(REPO_ROOT, "tests/configs/smoke.gin"))

# `celerity` with SIGINT as at a terminal, even where the tests run as a background job (which ignores it).
_CELERITY = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "from celerity_jax.cli import main; sys.exit(main())")


@pytest.fixture(scope="session")
def repo_root() -> str:
    return REPO_ROOT


@pytest.fixture(scope="session")
def on_eight_devices():
    """(code, timeout) -> the stdout of `code` run by a new Python on 8 fake CPU devices; the test fails with its
    stderr where it fails."""
    def run(code: str, timeout: int = 300) -> str:
        flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout
    return run


@pytest.fixture(scope="session")
def gone_within():
    """(pid, seconds) -> whether the process has exited within that many seconds (a zombie waiting for its
    reaper counts as gone)."""
    import time

    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    def wait(pid: int, seconds: float) -> bool:
        deadline = time.time() + seconds
        while not gone(pid) and time.time() < deadline:
            time.sleep(0.05)
        return gone(pid)
    return wait


@pytest.fixture(scope="session")
def tiny_gin() -> tuple[str, ...]:
    """The gin files of the smallest tiny run (d48 with tests/configs/smoke.gin)."""
    return TINY_GIN


@pytest.fixture(scope="session")
def tiny_configs():
    """(*bindings) -> the RunConfigs of the tiny run with those gin bindings."""
    from celerity_jax import gin_config

    return lambda *bindings: gin_config.parse_gin(TINY_GIN, list(bindings))


@pytest.fixture(scope="session")
def tiny_run(tiny_configs):
    """(*bindings) -> the RunDefinition of the tiny run with those gin bindings, as `train.loop.train` takes it."""
    from celerity_jax.configs import RunDefinition

    return lambda *bindings: RunDefinition.of(tiny_configs(*bindings))


@pytest.fixture(scope="session")
def tpu_slice() -> str:
    """The slice the compile tests compile for on this CPU host: libtpu compiles without a TPU."""
    pytest.importorskip("libtpu", reason="libtpu (extra 'tpu', installed by `make test`) is absent")
    return "v5e-4"


@pytest.fixture(scope="session")
def too_big() -> list[str]:
    """Bindings that make the tiny run's step larger than a v5e chip's 16 GiB: whole float32 logits of 64 × 8192
    tokens over a 128k vocabulary."""
    return ["ModelConfig.vocab_size = 128256", "ModelConfig.max_seq_len = 8192", "RecipeConfig.seq_len = 8192",
            "RecipeConfig.batch_seqs = 64", "ModelConfig.logits_chunk_len = 0"]


@pytest.fixture(scope="session")
def report_keys() -> set[str]:
    """Keys every compile report holds."""
    return {"hbm_bytes_per_chip", "bytes_per_chip", "fits", "headroom", "mesh_shape", "microbatches", "remat",
            "scan_layers", "compute_dtype", "residual_dtype", "attention_impl", "unsplit", "est_step_seconds",
            "est_tokens_per_sec", "est_mfu", "est_days", "est_chip_hours", "compile_seconds"}


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> str:
    """The run directory of the tiny run trained to its end (checkpoints at steps 100, 110 and 114); read it,
    never write it."""
    from celerity_jax import run

    workdir = str(tmp_path_factory.mktemp("trained") / "tiny")
    run.load(run.RunSpec(workdir, TINY_GIN)).train_to(log=lambda _: None)
    return workdir


@pytest.fixture(scope="session")
def curve_losses():
    """(workdir) -> {step: loss} from its curve.csv."""
    def losses(workdir) -> dict[int, float]:
        with open(os.path.join(workdir, "curve.csv")) as f:
            return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}

    return losses


@pytest.fixture(scope="session")
def celerity_train():
    """(workdir, *bindings, flags=(), **popen) -> a started `celerity train` of the tiny run (stdout and stderr
    together in .stdout), which handles SIGINT as at a terminal."""
    def start(workdir, *bindings, flags=(), **popen) -> subprocess.Popen:
        cmd = [sys.executable, "-c", _CELERITY, "train", "--workdir", str(workdir), *flags]
        for path in TINY_GIN:
            cmd += ["--gin-file", path]
        for binding in bindings:
            cmd += ["--gin-param", binding]
        return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                **popen)

    return start


class FakeTrainer:
    """Stands in for `train.loop.train` in the tests of its callers: writes what the trainer writes (run.json,
    plan.json, curve.csv) from `loss(plan, step_T)`, up to TrainConfig.stop_at_step or the end, resuming where
    the curve ends; archives the workdir with `force_new`. Records each call."""

    def __init__(self, loss=None):
        self.loss = loss or (lambda plan, step_T: 3.0 - step_T / plan.steps)
        self.calls = []

    def __call__(self, run, workdir, force_new=False, verbose=False, log=print):
        import numpy as np

        from celerity_jax import rundir

        plan, configs = run.plan, run.configs
        self.calls.append({"workdir": workdir, "stop_at_step": configs.train.stop_at_step, "force_new": force_new,
                           "operative_config": run.operative_gin})
        if force_new:
            rundir.archive_workdir(workdir, log)
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, rundir.RUN_JSON), "w") as f:
            f.write(json.dumps(run.identity.record))
        with open(os.path.join(workdir, rundir.PLAN_JSON), "w") as f:
            f.write(plan.to_json())
        path = os.path.join(workdir, rundir.CURVE_CSV)
        start = 0
        if os.path.exists(path):
            with open(path) as f:
                start = int(f.read().strip().splitlines()[-1].split(",")[0])
        else:
            with open(path, "w") as f:
                f.write("step,tokens,frac,loss\n")
        end = run.last_step
        step_T = np.arange(start + 1, end + 1)
        with open(path, "a") as f:
            f.writelines(f"{s},{s * plan.batch_tokens},{float(s / plan.steps)!r},{float(v)!r}\n"
                         for s, v in zip(step_T, self.loss(plan, step_T)))
        return {"stopped": "finished" if end == plan.steps else "stop_at_step", "final_step": int(end)}


@pytest.fixture
def fake_trainer():
    """The FakeTrainer class: `fake_trainer()` or `fake_trainer(loss)`."""
    return FakeTrainer
