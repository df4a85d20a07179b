"""The downstream frontier: average accuracy against training FLOPs for runs scored by `celerity eval`, next to
the points the Celerity paper published (`published_points.json`), with the paper's form
Acc = 100 − (C/C₀)^(−k) fitted to the runs.

When the runs average other tasks (or other shots) than the paper's seven, their accuracies and the paper's
are different quantities: the figure then draws the published points in grey on a second y-axis of their own
(the x-axis, training FLOPs, is shared and comparable), and its title and the table say that the y-values
are not comparable.
"""

import dataclasses
import importlib.resources
import json
import math
import os
import re
import textwrap
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from celerity_jax import markdown
from celerity_jax.errors import ConfigError
from celerity_jax.evaluate.results import DOWNSTREAM_DIR
from celerity_jax.fileio import check_input_file, save_figure_atomic

PUBLISHED_FILE = "published_points.json"
RESULT_NAME = re.compile(r"step_(\d+)\.json")
SCHEMA_FIX = ("give a result JSON written by `celerity eval` (with n_params, tokens, train_flops, tasks and, "
              "for 2 tasks or more, average)")
FORM = "Acc = 100 − (C/C₀)^(−k)"

Tasks = tuple[tuple[str, int], ...]  # (task, shots), sorted by task


@dataclasses.dataclass(frozen=True)
class Point:
    """One model on the frontier: a run scored by `celerity eval`, or a published model."""
    label: str
    source: str      # the result file, or the publication
    flops: float     # training FLOPs C
    accuracy: float  # average accuracy over `tasks` (%), or the one task's accuracy
    n_params: float
    tokens: float
    tasks: Tasks
    family: str = ""  # published models only


@dataclasses.dataclass(frozen=True)
class Published:
    points: list[Point]
    tasks: Tasks
    citation: str
    note: str  # what the data file leaves out, and why


class Fit(NamedTuple):
    """Acc = 100 − (C/C₀)^(−k). C₀ is kept as log10 C₀ = log10 C + log10(100 − Acc)/k, which exceeds
    float64's range for the small k of small runs (k = 0.005 at 70% error puts C₀ beyond 10^369)."""
    log10_c0: float
    k: float


def describe_tasks(tasks: Tasks) -> str:
    return ", ".join(f"{task} {shots}-shot" for task, shots in tasks)


def _result_file(path: str) -> str:
    """`path` itself, or for a run directory its newest downstream/step_<S>.json (largest S)."""
    if not os.path.isdir(path):
        check_input_file(path, "RESULT_OR_RUN")
        return path
    folder = os.path.join(path, DOWNSTREAM_DIR)
    steps = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            match = RESULT_NAME.fullmatch(name)
            if match:
                steps[int(match.group(1))] = os.path.join(folder, name)
    if not steps:
        raise ConfigError(f"{path} is a folder without downstream results ({DOWNSTREAM_DIR}/step_<S>.json); "
                          "score the run with `celerity eval` first, or give a result JSON")
    return steps[max(steps)]


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _fraction(value, where: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{path}: {where} is {value!r}, not an accuracy in [0, 1]; {SCHEMA_FIX}")
    return float(value)


def _load_point(path: str) -> Point:
    try:
        with open(path) as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not JSON ({e}); {SCHEMA_FIX}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds no JSON object; {SCHEMA_FIX}")
    numbers = {}
    for key in ("n_params", "tokens", "train_flops"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ConfigError(f"{path}: '{key}' is {value!r}, not a positive number; {SCHEMA_FIX}")
        numbers[key] = float(value)
    scores, shots = data.get("tasks"), {}
    if not isinstance(scores, dict) or not scores:
        raise ConfigError(f"{path}: 'tasks' is missing or empty; {SCHEMA_FIX}")
    for task, score in scores.items():
        if not isinstance(score, dict) or not _is_count(score.get("shots")):
            raise ConfigError(f"{path}: task '{task}' needs a 'value' and whole-number 'shots'; {SCHEMA_FIX}")
        _fraction(score.get("value"), f"the value of task '{task}'", path)
        shots[task] = score["shots"]
    average = data.get("average")
    if average is None:
        if len(scores) > 1:
            raise ConfigError(f"{path} scores {len(scores)} tasks but has no 'average'; {SCHEMA_FIX}")
        (task, score), = scores.items()
        accuracy, averaged = score["value"], [task]
    else:
        averaged = average.get("tasks") if isinstance(average, dict) else None
        if not isinstance(averaged, list) or not averaged or not set(averaged) <= set(scores):
            raise ConfigError(f"{path}: 'average' needs 'tasks', a list of the scored tasks; {SCHEMA_FIX}")
        accuracy = _fraction(average.get("value"), "the average's value", path)
    workdir = data.get("workdir")
    label = os.path.basename(os.path.normpath(workdir)) if isinstance(workdir, str) and workdir else \
        os.path.basename(path)
    return Point(label, path, numbers["train_flops"], 100.0 * accuracy, numbers["n_params"], numbers["tokens"],
                 tuple(sorted((task, shots[task]) for task in set(averaged))))


def load_points(paths: Sequence[str]) -> list[Point]:
    """The points of result JSONs written by `celerity eval`, or of run directories (each its newest
    downstream/step_<S>.json). They must average one task set, with the same shots, to share a fit."""
    points = [_load_point(_result_file(path)) for path in paths]
    groups: dict[Tasks, list[str]] = {}
    for point in points:
        groups.setdefault(point.tasks, []).append(point.source)
    if len(groups) > 1:
        sets = "; ".join(f"{', '.join(files)}: {describe_tasks(tasks)}" for tasks, files in groups.items())
        raise ConfigError(f"the results average different tasks, so they cannot share a fit ({sets}); score "
                          "every run on the same tasks and shots with `celerity eval`")
    return points


def load_published() -> Published:
    """The paper's points shipped with the package (`published_points.json`)."""
    with importlib.resources.files("celerity_jax.evaluate").joinpath(PUBLISHED_FILE).open() as f:
        data = json.load(f)
    tasks = tuple(sorted(data["tasks"].items()))
    source = data["source"]
    citation = f"{source['paper']}, {source['table']} (arXiv {source['arxiv']}, {source['url']})"
    points = [Point(p["name"], f"arXiv {p['source']['arxiv']}, {p['source']['table']}", p["train_flops"],
                    p["average"], p["params"], p["tokens"], tasks, p["family"]) for p in data["points"]]
    return Published(points, tasks, citation, data["note"])


def fit_frontier(flops: Sequence[float], acc_percent: Sequence[float]) -> Fit:
    """Fits Acc = 100 − (C/C₀)^(−k) to accuracies (%) at training FLOPs C, by linear least squares of
    log(100 − Acc) = −k·log C + k·log C₀. NumPy only, with no nonlinear refinement: the errors are weighted in
    log(100 − Acc), not in Acc. Points at 100% (log 0) are left out. Needs 2 or more points below 100% at
    distinct FLOPs, and accuracy that rises with compute (k > 0)."""
    flops_P, acc_P = np.asarray(flops, np.float64), np.asarray(acc_percent, np.float64)
    below_P = acc_P < 100.0
    log_c_P, log_err_P = np.log10(flops_P[below_P]), np.log10(100.0 - acc_P[below_P])
    if np.unique(log_c_P).size < 2:
        raise ConfigError(f"the fit of {FORM} needs 2 or more points with accuracy below 100% at different "
                          f"training FLOPs (got {log_c_P.size} below 100%, at {np.unique(log_c_P).size} FLOPs); "
                          "score more runs of the family, of other sizes or token budgets, with `celerity eval`")
    slope, intercept = np.polyfit(log_c_P, log_err_P, 1)
    k = -slope
    if k <= 0:
        raise ConfigError(f"accuracy does not rise with training FLOPs across these points (fitted k = {k:.3g}), "
                          f"so {FORM} has no frontier to fit; check the scores, or add runs further apart in "
                          "compute")
    return Fit(float(intercept / k), float(k))


def frontier_accuracy(flops, fit: Fit) -> np.ndarray:
    """The fitted accuracy (%) at training FLOPs `flops`."""
    return 100.0 - np.power(10.0, -fit.k * (np.log10(np.asarray(flops, np.float64)) - fit.log10_c0))


def celerity_fit(published: Published) -> Fit:
    """The same form fitted here to the paper's Celerity points (its own fitted constants are not shipped)."""
    celerity = [p for p in published.points if p.family == "Celerity"]
    return fit_frontier([p.flops for p in celerity], [p.accuracy for p in celerity])


def comparable(points: Sequence[Point], published: Published) -> bool:
    """Whether the runs average the paper's tasks with the paper's shots."""
    return points[0].tasks == published.tasks


def _fit_text(fit: Fit) -> str:
    return f"C₀ = 10^{fit.log10_c0:.2f} FLOPs, k = {fit.k:.4g}"


def plot_frontier(points: Sequence[Point], published: Published | None, fit: Fit, path: str) -> None:
    """The PNG at `path` (written atomically): the runs and their fit; with `published`, the paper's Celerity
    series with its fit (dashed) and its baselines as labelled markers, on a second y-axis when the tasks differ."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6), dpi=120, layout="constrained")  # constrained: makes room for the legend below
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.margins(x=0.1)  # room for the labels of the outermost points
    flops_P = np.array([p.flops for p in points])
    ax.plot(flops_P, [p.accuracy for p in points], "o", color="C0", label="your runs")
    for p in points:
        ax.annotate(p.label, (p.flops, p.accuracy), xytext=(4, 4), textcoords="offset points", fontsize=7)
    curve_C = np.geomspace(flops_P.min() / 2, flops_P.max() * 2, 200)
    ax.plot(curve_C, frontier_accuracy(curve_C, fit), "-", color="C0", label=f"fit of {FORM}: {_fit_text(fit)}")
    ax.set_xlabel("training FLOPs C")
    ax.set_ylabel("average accuracy (%)")
    tasks = describe_tasks(points[0].tasks)
    title = ["Downstream frontier: average accuracy against training FLOPs", f"your runs average {tasks}"]
    axes = [ax]
    if published is not None:
        same = comparable(points, published)
        pax, color = (ax, "C3") if same else (ax.twinx(), "0.5")
        celerity = sorted((p for p in published.points if p.family == "Celerity"), key=lambda p: p.flops)
        pax.plot([p.flops for p in celerity], [p.accuracy for p in celerity], "s-", color=color,
                 label="Celerity (paper, 234 TPP)")
        paper_fit = celerity_fit(published)
        paper_C = np.geomspace(celerity[0].flops / 2, celerity[-1].flops * 2, 200)
        pax.plot(paper_C, frontier_accuracy(paper_C, paper_fit), "--", color=color,
                 label=f"Celerity, same form fitted here: {_fit_text(paper_fit)}")
        for p in published.points:
            if p.family != "Celerity":
                pax.plot(p.flops, p.accuracy, "^", color=color, label=p.label)
            pax.annotate(p.label, (p.flops, p.accuracy), xytext=(4, -10), textcoords="offset points", fontsize=7,
                         color=color)
        if same:
            title[-1] = f"your runs and the paper's points average {tasks}"
        else:
            axes.append(pax)
            pax.set_ylabel("the paper's 7-task average accuracy (%): another quantity", color=color)
            title.append("different tasks: your runs (left axis) and the paper's (right axis) are not comparable "
                         "in accuracy")
    handles, labels = [], []
    for a in axes:
        more_handles, more_labels = a.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.set_title("\n".join(textwrap.fill(line, 100) for line in title), fontsize=8)
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncols=2)
    save_figure_atomic(fig, path)


def frontier_table(points: Sequence[Point], fit: Fit, published: Published | None) -> str:
    """Markdown: the runs with the fit's prediction, the fit's C₀ and k, and the published rows."""
    rows = [(p.label, f"{p.n_params:.3g}", f"{p.tokens:.3g}", f"{p.flops:.3g}", f"{p.accuracy:.2f}",
             f"{float(frontier_accuracy(p.flops, fit)):.2f}") for p in points]
    lines = [f"## Your runs: average accuracy over {describe_tasks(points[0].tasks)}", ""]
    lines += markdown.table(("run", "N", "tokens", "training FLOPs", "accuracy (%)", "fit (%)"), rows)
    lines += ["", f"Fit of {FORM} to {len(points)} runs: {_fit_text(fit)} (linear least squares of "
                  "log(100 − Acc) on log C)."]
    if published is None:
        return "\n".join(lines)
    lines += ["", f"## Published: {published.citation}", ""]
    if not comparable(points, published):
        lines += [f"Not comparable with your runs in accuracy: these average {describe_tasks(published.tasks)}.",
                  ""]
    lines += markdown.table(("model", "family", "N", "tokens", "training FLOPs", "average accuracy (%)"),
                            [(p.label, p.family, f"{p.n_params:.3g}", f"{p.tokens:.3g}", f"{p.flops:.3g}",
                              f"{p.accuracy:.2f}") for p in published.points])
    lines += ["", f"The same form fitted here to the Celerity rows: {_fit_text(celerity_fit(published))}.", "",
              f"Note: {published.note}"]
    return "\n".join(lines)


def frontier_summary(points: Sequence[Point], fit: Fit, published: Published | None) -> dict:
    """What `celerity frontier --json` prints: the points, the fits and the published rows."""
    def row(p: Point) -> dict:
        return {"label": p.label, "source": p.source, "train_flops": p.flops, "accuracy": p.accuracy,
                "n_params": p.n_params, "tokens": p.tokens}

    summary = {"tasks": dict(points[0].tasks), "form": FORM,
               "fit": {"log10_c0": fit.log10_c0, "k": fit.k},
               "points": [row(p) | {"fit_accuracy": float(frontier_accuracy(p.flops, fit))} for p in points]}
    if published is not None:
        paper_fit = celerity_fit(published)
        summary["published"] = {"citation": published.citation, "tasks": dict(published.tasks),
                                "comparable": comparable(points, published), "note": published.note,
                                "celerity_fit": {"log10_c0": paper_fit.log10_c0, "k": paper_fit.k},
                                "points": [row(p) | {"family": p.family} for p in published.points]}
    return summary
