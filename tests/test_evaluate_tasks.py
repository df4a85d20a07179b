"""Which tasks a --tasks list names, with their shots and metrics, and the checks of their local data files."""

import json

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import builtin_task, tasks

KNOWN = ["arc_challenge", "arc_easy", "boolq", "hellaswag", "piqa", "social_iqa", "winogrande", "lambada_openai"]


def test_a_preset_expands_and_a_task_takes_its_preset_shots_unless_given():
    specs = tasks.parse_tasks("celerity", KNOWN)
    assert [(s.name, s.shots) for s in specs] == list(tasks.PRESETS["celerity"])
    specs = tasks.parse_tasks(f"hellaswag, arc_easy:3, lambada_openai, {builtin_task.TASK_NAME}", KNOWN)
    assert [(s.name, s.shots, s.metric) for s in specs] == [
        ("hellaswag", 10, "acc_norm"), ("arc_easy", 3, "acc_norm"), ("lambada_openai", 0, "acc"),
        (builtin_task.TASK_NAME, 0, "acc")]
    assert not tasks.needs_stock_tasks(f" {builtin_task.TASK_NAME}:2 ,") and tasks.needs_stock_tasks("piqa")


@pytest.mark.parametrize("text, problem", [
    ("hellaswagg", "unknown task 'hellaswagg'; did you mean hellaswag"),
    ("piqa:two", "write shots as task:N with N a whole number"),
    (" , ", "--tasks is empty"),
    ("celerity,piqa", "names a task twice"),
])
def test_a_bad_list_is_one_line_naming_the_fix(text, problem):
    with pytest.raises(ConfigError, match=problem):
        tasks.parse_tasks(text, KNOWN)


def test_each_split_file_must_hold_documents_with_the_fields_the_task_reads(tmp_path):
    stock = {"training_split": "train", "validation_split": "validation", "test_split": None}
    (tmp_path / "piqa").mkdir()
    document = {"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
    (tmp_path / "piqa" / "train.jsonl").write_text(json.dumps(document) + "\n\n")
    with pytest.raises(ConfigError, match=r"piqa/validation.jsonl is missing; .* the splits train, validation"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"validation.jsonl is empty"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text(json.dumps(document) + "\n[1]\n")
    with pytest.raises(ConfigError, match=r"validation.jsonl:2 is not one JSON object .* \(missing: goal, sol1"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text(json.dumps(document) + "\n")
    assert tasks.data_files(stock, "piqa", str(tmp_path)) == {
        split: str(tmp_path / "piqa" / f"{split}.jsonl") for split in ("train", "validation")}
