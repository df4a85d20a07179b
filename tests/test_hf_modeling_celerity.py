"""`lm_eval --model hf` on an export scores the built-in task as `celerity eval` does on the run (slow: a minute)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from celerity_jax.cli import main  # noqa: E402
from celerity_jax.evaluate import builtin_task, harness, loader, tasks  # noqa: E402


@pytest.mark.slow
def test_hf_harness_scores_as_ours(trained_run, tmp_path):
    import lm_eval

    out = str(tmp_path / "hf")
    assert main(["export-hf", "--workdir", trained_run, "--out", out]) == 0
    task_manager = tasks.task_manager()
    task = task_manager.load([builtin_task.task_config(50)])["tasks"][builtin_task.TASK_NAME]
    model = loader.load_model(trained_run)
    scores = {}
    for lm, args in ((harness.CelerityLM(model.cfg, model.params, model.mesh, model.tokenizer), None),
                     ("hf", f"pretrained={out},trust_remote_code=True,dtype=float32,device=cpu,batch_size=16")):
        results = lm_eval.simple_evaluate(model=lm, model_args=args, tasks=[task], limit=50, bootstrap_iters=0,
                                          task_manager=task_manager, log_samples=False)
        scores[str(args)] = {k: v for k, v in results["results"][builtin_task.TASK_NAME].items() if "stderr" not in k}
    ours, theirs = scores.values()
    assert ours == theirs and ours["acc,none"] > 0
