"""The search's compiles: the most urgent first, and a compile that raises as a result."""

from celerity_jax.aot import workers
from celerity_jax.errors import ConfigError


def test_the_most_urgent_compile_runs_first_and_a_config_error_comes_back_as_a_result(monkeypatch):
    ran = []

    def fake_run(task):
        ran.append(task[0])
        if task[0] == "step":
            raise ConfigError("the batch does not split")
        return {"kind": task[0]}

    monkeypatch.setattr(workers, "run_task", fake_run)
    compiler = workers.Compiler(1, failed=lambda setting, e: {"setting": setting, "error": str(e)})
    compiler.submit(("piece", "a"), ("piece", None, None, "setting a", None, ("update",)))
    compiler.submit(("estimate", "b"), ("estimate", None, None, "setting b", None))
    compiler.submit(("step", "c"), ("step", None, None, "setting c", None))
    results = [compiler.next(timeout=1) for _ in range(3)]
    assert ran == ["step", "estimate", "piece"] and compiler.running == 0
    assert results[0] == (("step", "c"), {"setting": "setting c", "error": "the batch does not split"})
    assert results[1] == (("estimate", "b"), {"kind": "estimate"})
    compiler.close(stop=False)
