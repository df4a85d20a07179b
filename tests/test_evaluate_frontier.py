import importlib.resources
import json
import os

import numpy as np
import pytest

from celerity_jax import cli
from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import frontier

PAPER_TASKS = {"arc_challenge": 25, "arc_easy": 0, "boolq": 0, "hellaswag": 10, "piqa": 0, "social_iqa": 0,
               "winogrande": 5}
CELERITY = {  # name: (N, tokens, 7-task average at 234 TPP), from the paper
    "Celerity-300M": (2.71e8, 63.4e9, 46.43), "Celerity-500M": (5.03e8, 117.8e9, 51.40),
    "Celerity-900M": (9.06e8, 212.3e9, 54.23), "Celerity-1.8B": (1.81e9, 424.0e9, 61.00),
    "Celerity-3.9B": (3.88e9, 909.2e9, 65.28)}
LOG10_C0, K = 40.0, 0.06  # the synthetic family lies exactly on the form
SIZES = (1e5, 3e5, 1e6)
TPP = 20


def _accuracy(flops: float) -> float:
    return float(frontier.frontier_accuracy(flops, frontier.Fit(LOG10_C0, K)))


def _write_result(path, workdir, n_params: float, accuracy: float, tasks=PAPER_TASKS, step: int = 100) -> str:
    """A result JSON as `celerity eval` writes it; every task scores `accuracy` (%)."""
    scores = {task: {"metric": "acc_norm", "value": accuracy / 100, "stderr": 0.01, "docs": 100, "shots": shots,
                     "truncated": 0} for task, shots in tasks.items()}
    data = {"workdir": workdir, "step": step, "n_params": n_params, "tokens": TPP * n_params,
            "train_flops": 6 * TPP * n_params**2, "tasks": scores}
    if len(tasks) > 1:
        data["average"] = {"value": accuracy / 100, "tasks": list(tasks)}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
    return str(path)


def _family(root, tasks=PAPER_TASKS) -> list[str]:
    """Run directories of the synthetic family, each scored at its last step (and earlier)."""
    runs = []
    for i, n in enumerate(SIZES):
        run = os.path.join(root, f"run{i}")
        _write_result(os.path.join(run, "downstream", "step_9.json"), run, n, 1.0, tasks, step=9)
        _write_result(os.path.join(run, "downstream", "step_200.json"), run, n, _accuracy(6 * TPP * n * n), tasks,
                      step=200)
        runs.append(run)
    return runs


def _celerity(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["frontier", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_fit_recovers_the_form():
    flops_P = np.geomspace(1e20, 2e22, 5)
    fit = frontier.fit_frontier(flops_P, frontier.frontier_accuracy(flops_P, frontier.Fit(94.7, 0.08)))
    assert fit.log10_c0 == pytest.approx(94.7, rel=1e-9)
    assert fit.k == pytest.approx(0.08, rel=1e-9)
    # a small k whose C₀ is beyond float64 (10^400)
    fit = frontier.fit_frontier([1e10, 1e12], frontier.frontier_accuracy([1e10, 1e12], frontier.Fit(400.0, 0.005)))
    assert fit == pytest.approx((400.0, 0.005), rel=1e-9)


@pytest.mark.parametrize("flops, acc, match", [
    ([1e12], [40.0], "needs 2 or more points"),
    ([1e12, 1e12], [40.0, 41.0], "needs 2 or more points"),
    ([1e12, 1e13, 1e14], [40.0, 100.0, 100.0], "needs 2 or more points"),
    ([1e12, 1e13], [45.0, 40.0], "does not rise"),
])
def test_fit_refuses(flops, acc, match):
    with pytest.raises(ConfigError, match=match):
        frontier.fit_frontier(flops, acc)


def test_load_points_reads_files_and_run_directories(tmp_path):
    runs = _family(tmp_path)
    with open(os.path.join(runs[0], "downstream", "notes.txt"), "w") as f:
        f.write("not a result")
    single = _write_result(tmp_path / "one.json", "", 2e6, 30.0, {"stdlib_next_line": 0})
    points = frontier.load_points(runs)
    assert [p.label for p in points] == ["run0", "run1", "run2"]
    assert [p.source for p in points] == [os.path.join(r, "downstream", "step_200.json") for r in runs]
    assert [p.accuracy for p in points] == pytest.approx([_accuracy(6 * TPP * n * n) for n in SIZES])
    assert points[1].flops == 6 * TPP * SIZES[1]**2 and points[1].tokens == TPP * SIZES[1]
    assert points[0].tasks == tuple(sorted(PAPER_TASKS.items()))
    point, = frontier.load_points([single])
    assert (point.label, point.accuracy, point.tasks) == ("one.json", 30.0, (("stdlib_next_line", 0),))


def test_cli_writes_the_figure_and_the_table(tmp_path, capsys):
    runs = _family(tmp_path / "runs")
    out = tmp_path / "frontier"
    code, stdout, _ = _celerity(capsys, *runs, "--out", str(out))
    assert code == 0
    with open(out / "frontier.png", "rb") as f:
        png = f.read()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    table = (out / "frontier.md").read_text()
    assert table.strip() in stdout
    for run, n in zip(("run0", "run1", "run2"), SIZES):
        assert f"| {run} | {n:.3g} |" in table
    for name, (_, _, average) in CELERITY.items():
        assert f"| {name} | Celerity |" in table and f"| {average:.2f} |" in table
    assert f"k = {K:.4g}" in table and "Not comparable" not in table

    code, stdout, _ = _celerity(capsys, *runs, "--out", str(out), "--no-published", "--json")
    summary = json.loads(stdout)
    assert code == 0 and "published" not in summary and "Celerity" not in (out / "frontier.md").read_text()
    assert summary["fit"] == pytest.approx({"log10_c0": LOG10_C0, "k": K})
    assert [p["fit_accuracy"] for p in summary["points"]] == pytest.approx([p["accuracy"] for p in summary["points"]])


def test_cli_says_when_the_tasks_are_not_the_papers(tmp_path, capsys):
    runs = _family(tmp_path / "runs", {"stdlib_next_line": 0})
    code, stdout, _ = _celerity(capsys, *runs, "--out", str(tmp_path / "out"))
    assert code == 0 and "Not comparable with your runs" in stdout and "| Celerity-3.9B |" in stdout
    assert os.path.getsize(tmp_path / "out" / "frontier.png") > 20_000


def _bad_inputs(tmp_path) -> dict[str, tuple[list[str], str]]:
    """name: (arguments before --out, the phrase of the error)."""
    runs = _family(tmp_path / "runs")
    other = _family(tmp_path / "other", {"arc_easy": 0, "piqa": 0})
    no_fields = tmp_path / "no_fields.json"
    no_fields.write_text(json.dumps({"workdir": "x", "step": 1, "tasks": {}}))
    not_json = tmp_path / "not.json"
    not_json.write_text("{")
    os.makedirs(tmp_path / "empty_run")
    return {"missing": ([*runs, str(tmp_path / "nope.json")], "nope.json does not exist"),
            "schema": ([*runs, str(no_fields)], "'n_params' is None"),
            "not json": ([str(not_json)], "is not JSON"),
            "no results": ([*runs, str(tmp_path / "empty_run")], "without downstream results"),
            "tasks differ": ([*runs, other[0]], "average different tasks"),
            "one point": (runs[:1], "needs 2 or more points")}


@pytest.mark.parametrize("case", ["missing", "schema", "not json", "no results", "tasks differ", "one point"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case):
    argv, phrase = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    code, stdout, err = _celerity(capsys, *argv, "--out", str(out))
    assert code == 2 and stdout == ""
    line, = err.strip().splitlines()
    assert line.startswith("celerity frontier: error: ") and phrase in line
    assert not out.exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    runs = _family(tmp_path / "runs")
    out = tmp_path / "out.md"
    out.write_text("mine")
    code, _, err = _celerity(capsys, *runs, "--out", str(out))
    line, = err.strip().splitlines()
    assert code == 2 and "--out" in line and "is a file" in line
    assert out.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["out.md", "runs"]


def test_published_points_have_the_celerity_rows_and_sources():
    text = importlib.resources.files("celerity_jax.evaluate").joinpath(frontier.PUBLISHED_FILE).read_text()
    data = json.loads(text)
    rows = {row["name"]: row for row in data["points"]}
    for name, (n_params, tokens, average) in CELERITY.items():
        row = rows[name]
        assert (row["family"], row["params"], row["tokens"], row["average"]) == ("Celerity", n_params, tokens,
                                                                                 average)
        assert row["train_flops"] == pytest.approx(6 * n_params * tokens, rel=1e-4) and "6*N*D" in row["flops_note"]
    for row in data["points"]:
        source = row["source"]
        assert source["arxiv"] == "2509.25087" and source["table"] == "Table 10"
        assert source["url"].startswith("https://arxiv.org/") and source["paper"]
    published = frontier.load_published()
    assert published.tasks == tuple(sorted(PAPER_TASKS.items())) and published.note
    assert frontier.celerity_fit(published).k > 0
