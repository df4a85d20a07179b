"""Downstream results: a step's file gathering every task scored at it, its average, and its table."""

import pytest

from celerity_jax.evaluate import results, tasks

PLAN = {"batch_tokens": 1000, "steps": 100, "n_params": 5000, "flops_per_token": 6.0}


def _score(value: float, metric: str = "acc") -> dict:
    return {"metric": metric, "value": value, "stderr": 0.01, "shots": 0, "docs": 10, "truncated": 0}


def test_the_average_is_the_papers_seven_once_all_are_scored():
    paper = [name for name, _ in tasks.PRESETS["celerity"]]
    assert results.average({"piqa": _score(0.5)}) is None
    assert results.average({"piqa": _score(0.5), "boolq": _score(0.7)}) == {"value": pytest.approx(0.6),
                                                                           "tasks": ["boolq", "piqa"]}
    scores = {name: _score(0.5) for name in paper} | {"lambada_openai": _score(1.0)}
    assert results.average(scores) == {"value": pytest.approx(0.5), "tasks": paper}


def test_a_later_score_of_a_task_replaces_the_earlier_and_the_rest_stay(tmp_path):
    workdir = str(tmp_path)
    assert results.load(workdir, 50) is None
    results.record(workdir, 50, PLAN, {"piqa": _score(0.5), "boolq": _score(0.6)}, write_tensorboard=False)
    content = results.record(workdir, 50, PLAN, {"piqa": _score(0.7, "acc_norm")}, write_tensorboard=False)
    assert content == results.load(workdir, 50)
    assert {name: s["value"] for name, s in content["tasks"].items()} == {"piqa": 0.7, "boolq": 0.6}
    assert (content["frac"], content["tokens"], content["train_flops"]) == (0.5, 50_000, 300_000.0)
    assert content["average"]["value"] == pytest.approx(0.65)
    assert results.scalars(content, {"piqa": _score(0.7, "acc_norm")}) == {
        "downstream/piqa/acc_norm": 0.7, "downstream/average": pytest.approx(0.65)}
    lines = results.table(content)
    assert lines[0] == "step 50: N=5,000, 50,000 tokens, 3e+05 training FLOPs"
    assert "| average (2 tasks) |  | 65.00 |" in lines[-1] and any("| piqa | acc_norm | 70.00 | 1.00 |" in line
                                                                  for line in lines)
