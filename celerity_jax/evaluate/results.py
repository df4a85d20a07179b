"""Where downstream scores go: `downstream/step_<S>.json` in the run directory, TensorBoard scalars
`downstream/<task>/<metric>` (and `downstream/average`) at step S, and a printed table.

A step's file gathers every task scored at that step (a later score of a task replaces the earlier). Its
`average` is over the `celerity` preset's seven tasks once all are scored, as the paper's Table 10 averages
them, and otherwise over every task in the file; it lists the tasks it averages.
"""

import json
import os
import time

from celerity_jax import markdown
from celerity_jax.evaluate import tasks
from celerity_jax.fileio import write_json_atomic

DOWNSTREAM_DIR = "downstream"


def result_path(workdir: str, step: int) -> str:
    return os.path.join(workdir, DOWNSTREAM_DIR, f"step_{step}.json")


def load(workdir: str, step: int) -> dict | None:
    """The step's results file, or None when nothing was scored at that step."""
    path = result_path(workdir, step)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def average(scores: dict[str, dict]) -> dict | None:
    """{"value", "tasks"}: the mean over the paper's seven when all are there, else over all; None below two."""
    paper = [name for name, _ in tasks.PRESETS["celerity"]]
    names = paper if set(paper) <= set(scores) else sorted(scores)
    if len(names) < 2:
        return None
    return {"value": sum(scores[n]["value"] for n in names) / len(names), "tasks": names}


def merged(workdir: str, step: int, plan: dict, scores: dict[str, dict]) -> dict:
    """The step's file with `scores` (harness.run_tasks's) added; nothing is written."""
    tasks_scored = {**(load(workdir, step) or {}).get("tasks", {}), **scores}
    tokens = step * plan["batch_tokens"]
    content = {"workdir": os.path.abspath(workdir), "step": step, "frac": step / plan["steps"],
               "n_params": plan["n_params"], "tokens": tokens, "train_flops": tokens * plan["flops_per_token"],
               "tasks": tasks_scored, "evaluated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if (avg := average(tasks_scored)) is not None:
        content["average"] = avg
    return content


def write(workdir: str, content: dict, scores: dict[str, dict], write_tensorboard: bool = True) -> None:
    """Writes the step's file (`merged`'s content) and TensorBoard's values of the new `scores`."""
    path = result_path(workdir, content["step"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, content)
    if write_tensorboard:
        from celerity_jax.rundir.writers import TensorBoardWriter

        tb = TensorBoardWriter(workdir)
        tb.scalars(content["step"], scalars(content, scores))
        tb.close()


def record(workdir: str, step: int, plan: dict, scores: dict[str, dict], write_tensorboard: bool = True) -> dict:
    """Adds `scores` (harness.run_tasks's) to the step's file and to TensorBoard; returns the file's content."""
    content = merged(workdir, step, plan, scores)
    write(workdir, content, scores, write_tensorboard)
    return content


def scalars(content: dict, scores: dict[str, dict]) -> dict[str, float]:
    """The TensorBoard values of `scores`, and the file's average."""
    values = {f"downstream/{name}/{s['metric']}": s["value"] for name, s in scores.items()}
    if "average" in content:
        values["downstream/average"] = content["average"]["value"]
    return values


def table(content: dict) -> list[str]:
    """The step's scores as a markdown table, the average last."""
    rows = [[name, s["metric"], f"{100 * s['value']:.2f}",
             "" if s["stderr"] is None else f"{100 * s['stderr']:.2f}", s["shots"], s["docs"], s["truncated"]]
            for name, s in content["tasks"].items()]
    if "average" in content:
        rows.append([f"average ({len(content['average']['tasks'])} tasks)", "", f"{100 * content['average']['value']:.2f}",
                     "", "", "", ""])
    head = [f"step {content['step']}: N={content['n_params']:,}, {content['tokens']:,} tokens, "
            f"{content['train_flops']:.3g} training FLOPs", ""]
    return head + markdown.table(["task", "metric", "score (%)", "stderr", "shots", "docs", "truncated"], rows)
