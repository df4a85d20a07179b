"""Which tasks a --tasks list names, with their shots and metrics, and the checks of their local data files."""

import json
import re

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
    with pytest.raises(ConfigError, match=r"validation.jsonl holds no document"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text("\n  \n\n")
    with pytest.raises(ConfigError, match=r"validation.jsonl holds no document; it must hold one JSON object"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text(json.dumps(document) + "\n[1]\n")
    with pytest.raises(ConfigError, match=r"validation.jsonl:2 is not one JSON object .* \(not a JSON object\)"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text(json.dumps({"goal": "g"}) + "\n")
    with pytest.raises(ConfigError, match=r"validation.jsonl:1 is not one JSON object .* \(missing: sol1, sol2"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_bytes(json.dumps(document).encode() + b'\n{"goal": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match=r"validation.jsonl:2 is not UTF-8 text \(byte 0xe9\); save the file as"):
        tasks.data_files(stock, "piqa", str(tmp_path))
    (tmp_path / "piqa" / "validation.jsonl").write_text(json.dumps(document) + "\n")
    assert tasks.data_files(stock, "piqa", str(tmp_path)) == {
        split: str(tmp_path / "piqa" / f"{split}.jsonl") for split in ("train", "validation")}


GOOD = {
    "arc_easy": {"question": "q?", "answerKey": "B", "choices": {"text": ["a", "b"], "label": ["A", "B"]}},
    "boolq": {"passage": "p", "question": "q", "label": 1},
    "hellaswag": {"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["d", "e"], "label": "1"},
    "piqa": {"goal": "g", "sol1": "a", "sol2": "b", "label": 0},
    "social_iqa": {"context": "c", "question": "q", "answerA": "a", "answerB": "b", "answerC": "c", "label": "3"},
    "winogrande": {"sentence": "the _ sat", "option1": "cat", "option2": "dog", "answer": "2"},
}


@pytest.mark.parametrize("task, change, problem", [
    ("arc_easy", {"choices": "A) a B) b"}, "choices is not an object"),
    ("arc_easy", {"answerKey": "E"}, "answerKey 'E' is none of 'A', 'B'"),
    ("arc_easy", {"choices": {"text": ["a"], "label": ["A", "B"]}},
     'choices is not {"text": [...], "label": [...]}, two lists of strings of the same length'),
    ("arc_easy", {"question": 7}, "question is not a string"),
    ("boolq", {"label": True}, "label is not a whole number"),
    ("boolq", {"label": 2}, "label 2 is none of 0, 1"),
    ("hellaswag", {"label": "2"}, "label '2' is none of '0', '1'"),
    ("hellaswag", {"endings": ["d", 5]}, "endings is not a list of strings"),
    ("piqa", {"label": "1"}, "label is not a whole number"),
    ("social_iqa", {"label": "0"}, "label '0' is none of '1', '2', '3'"),
    ("winogrande", {"answer": "3"}, "answer '3' is none of '1', '2'"),
    ("winogrande", {"sentence": "no blank"}, "sentence holds no blank _ for the options"),
])
def test_a_document_the_stock_task_cannot_score_is_refused_with_its_line(task, change, problem, tmp_path):
    stock = {"training_split": "train", "validation_split": "validation", "test_split": "test"}
    (tmp_path / task).mkdir()
    for split in ("train", "validation", "test"):
        (tmp_path / task / f"{split}.jsonl").write_text(json.dumps(GOOD[task]) + "\n")
    assert tasks.data_files(stock, task, str(tmp_path), shots=1)
    (tmp_path / task / "test.jsonl").write_text(f"{json.dumps(GOOD[task])}\n\n{json.dumps(GOOD[task] | change)}\n")
    with pytest.raises(ConfigError, match=rf"{task}/test.jsonl:3 is not one JSON object per line with the fields "
                                          rf".*\({re.escape(problem)}\); rewrite the file"):
        tasks.data_files(stock, task, str(tmp_path))


def test_shots_are_refused_beyond_the_documents_they_are_drawn_from(tmp_path):
    """The harness draws few-shot examples from the training split, one more where it then leaves out the document
    scored (the few-shot split is the test split, both unset included); the built-in task draws from its own."""
    document = {"goal": "g", "sol1": "a", "sol2": "b", "label": 0}
    (tmp_path / "piqa").mkdir()
    for split, n in (("train", 6), ("validation", 2), ("dev", 3)):
        (tmp_path / "piqa" / f"{split}.jsonl").write_text("".join(json.dumps({**document, "goal": str(i)}) + "\n"
                                                                  for i in range(n)))
    piqa = {"training_split": "train", "validation_split": "validation", "test_split": None}
    assert tasks.data_files(piqa, "piqa", str(tmp_path), shots=5)
    with pytest.raises(ConfigError, match=r"^--tasks piqa:6: \S*piqa/train.jsonl gives at most 5 few-shot "
                                          r"examples; ask for 5 or fewer shots$"):
        tasks.data_files(piqa, "piqa", str(tmp_path), shots=6)
    with_test = {**piqa, "test_split": "validation"}
    assert tasks.data_files(with_test, "piqa", str(tmp_path), shots=6)
    with pytest.raises(ConfigError, match=r"piqa:1000: \S*piqa/train.jsonl gives at most 6 few-shot examples"):
        tasks.data_files(with_test, "piqa", str(tmp_path), shots=1000)
    with pytest.raises(ConfigError, match=r"piqa:4: \S*piqa/dev.jsonl gives at most 3 few-shot examples"):
        tasks.data_files({**with_test, "fewshot_split": "dev"}, "piqa", str(tmp_path), shots=4)
    (tmp_path / "piqa" / "dev.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"piqa/dev.jsonl is missing; the stock task reads the splits dev, train"):
        tasks.data_files({**with_test, "fewshot_split": "dev"}, "piqa", str(tmp_path))
    builtin = tasks.TaskSpec(builtin_task.TASK_NAME, builtin_task.DEFAULT_DOCS + 1)
    with pytest.raises(ConfigError, match=rf"--tasks {builtin_task.TASK_NAME}:501: the built-in task with 500 "
                                          r"documents \(--limit sets more\) gives at most 500 few-shot"):
        tasks.harness_config(builtin, None, None)
    assert tasks.harness_config(builtin, None, None, limit=501)["num_fewshot"] == 501
