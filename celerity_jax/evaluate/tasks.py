"""Which lm-evaluation-harness tasks `celerity eval` runs, on which local files, with how many shots, and which
metric each reports.

Stock tasks run from the harness's own task configs, unchanged (prompts, few-shot splits, metrics) except for
where their data comes from: `DIR/<task>/<split>.jsonl`, one JSON document per line in the dataset's own schema,
one file per split the stock config names. Nothing is downloaded.

The `celerity` preset is the paper's downstream protocol (its Table 10): seven tasks at the shots below and their
average. Each reports acc_norm (the log-likelihood per byte of a choice) where the choices are free text of
different lengths, whose raw log-likelihood favours the short ones: ARC, HellaSwag, PIQA. It reports acc where
length does not vary (BoolQ's "yes"/"no"; WinoGrande scores the same continuation after each option) or where the
stock task computes acc only (Social IQa). These choices are ours: the text of the paper we hold does not say
which metric each column is.
"""

import dataclasses
import difflib
import functools
import json
import os

from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import builtin_task

PRESETS = {
    "celerity": (("arc_challenge", 25), ("arc_easy", 0), ("boolq", 0), ("hellaswag", 10), ("piqa", 0),
                 ("social_iqa", 0), ("winogrande", 5)),
}
METRICS = {"arc_challenge": "acc_norm", "arc_easy": "acc_norm", "boolq": "acc", "hellaswag": "acc_norm",
           "piqa": "acc_norm", "social_iqa": "acc", "winogrande": "acc", builtin_task.TASK_NAME: "acc"}
# The fields each preset task's stock config reads from a document, each with its JSON type in the dataset's own
# schema (checked before the harness runs, with the answers: see _document_problem).
FIELDS = {
    "arc_challenge": {"question": str, "choices": dict, "answerKey": str},
    "arc_easy": {"question": str, "choices": dict, "answerKey": str},
    "boolq": {"passage": str, "question": str, "label": int},
    "hellaswag": {"activity_label": str, "ctx_a": str, "ctx_b": str, "endings": list, "label": str},
    "piqa": {"goal": str, "sol1": str, "sol2": str, "label": int},
    "social_iqa": {"context": str, "question": str, "answerA": str, "answerB": str, "answerC": str, "label": str},
    "winogrande": {"sentence": str, "option1": str, "option2": str, "answer": str},
}
TYPE_NAMES = {str: "a string", int: "a whole number", dict: "an object", list: "a list"}
# The answers of the tasks whose choices are fixed.
ANSWERS = {"boolq": ("label", [0, 1]), "piqa": ("label", [0, 1]), "social_iqa": ("label", ["1", "2", "3"]),
           "winogrande": ("answer", ["1", "2"])}
SPLIT_KEYS = ("training_split", "validation_split", "test_split", "fewshot_split")


@functools.cache
def task_manager(stock: bool = True):
    """The harness's task index (built once per process); with `stock`, of all its stock tasks, which takes
    seconds (it reads every task config), else empty (enough for the built-in task)."""
    try:
        from lm_eval.tasks import TaskManager  # offline: this module imported builtin_task
    except ImportError:
        raise ConfigError("downstream evaluation needs lm-evaluation-harness: pip install -e '.[eval]' (the "
                          "`eval` extra)") from None
    return TaskManager(include_defaults=stock)


def needs_stock_tasks(text: str) -> bool:
    """Whether a --tasks list names anything but the built-in task."""
    return any(t.strip().partition(":")[0] != builtin_task.TASK_NAME for t in text.split(",") if t.strip())


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str
    shots: int

    @property
    def metric(self) -> str:
        return METRICS.get(self.name, "acc")


def parse_tasks(text: str, known: list[str]) -> list[TaskSpec]:
    """A comma list of preset names, task names and `task:shots`; a task without shots gets the preset's (0 for
    tasks outside it). `known`: the harness's task names."""
    default_shots = {name: shots for preset in PRESETS.values() for name, shots in preset}
    specs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, shots = item.partition(":")
        if name in PRESETS and not shots:
            specs += [TaskSpec(n, s) for n, s in PRESETS[name]]
            continue
        if name != builtin_task.TASK_NAME and name not in known:
            close = difflib.get_close_matches(name, [*PRESETS, builtin_task.TASK_NAME, *known], n=4)
            hint = f"did you mean {', '.join(close)}?" if close else "see `lm_eval ls tasks`"
            raise ConfigError(f"--tasks: unknown task {name!r}; {hint} (or the preset 'celerity', or "
                              f"{builtin_task.TASK_NAME!r}, the built-in task)")
        if shots and not shots.isdigit():
            raise ConfigError(f"--tasks: {item!r}: write shots as task:N with N a whole number, e.g. hellaswag:10")
        specs.append(TaskSpec(name, int(shots) if shots else default_shots.get(name, 0)))
    if not specs:
        raise ConfigError("--tasks is empty; name tasks, e.g. --tasks celerity or --tasks arc_easy,piqa")
    if len({s.name for s in specs}) < len(specs):
        raise ConfigError(f"--tasks names a task twice ({text}); name each once")
    return specs


def data_files(stock_config: dict, task: str, data_dir: str, shots: int = 0) -> dict[str, str]:
    """{split: DIR/<task>/<split>.jsonl} for each split the stock config names, each checked: present, UTF-8, one
    JSON object per line with the fields the task reads, and enough documents to draw `shots` examples from."""
    splits = sorted({stock_config[k] for k in SPLIT_KEYS if stock_config.get(k)})
    files = {split: os.path.join(data_dir, task, f"{split}.jsonl") for split in splits}
    fields = FIELDS.get(task, {})
    expected = f"one JSON object per line with the fields {', '.join(fields)}" if fields else \
        "one JSON object per line in the dataset's own schema"
    counts = {}
    for split, path in files.items():
        if not os.path.isfile(path):
            raise ConfigError(f"{task}: {path} is missing; the stock task reads the splits {', '.join(splits)}, "
                              f"each a file of {expected} (docs/evaluation.md)")
        counts[split] = _check_documents(path, task, expected)
    pool, leaves_one_out = _fewshot_pool(stock_config)
    if pool in counts:
        _check_shots(task, shots, files[pool], counts[pool] - leaves_one_out)
    return files


def _fewshot_pool(config: dict) -> tuple[str | None, bool]:
    """The split lm-evaluation-harness draws a task's few-shot examples from (None: examples the config lists
    itself), and whether it draws one more to leave out the document being scored, as it does when that split
    is the config's test_split (both unset included)."""
    named = config.get("fewshot_split")
    if named is None and (config.get("fewshot_config") or {}).get("samples") is not None:
        return None, False
    pool = named or config.get("training_split") or config.get("validation_split") or config.get("test_split")
    return pool, named == config.get("test_split")


def _check_shots(task: str, shots: int, source: str, available: int) -> None:
    if shots > available:
        raise ConfigError(f"--tasks {task}:{shots}: {source} gives at most {available} few-shot examples; ask for "
                          f"{available} or fewer shots")


def _check_documents(path: str, task: str, expected: str) -> int:
    """The number of documents in the file; refuses the first line the stock task cannot use."""
    n_docs = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{path}:{n} is not UTF-8 text (byte {raw[e.start]:#04x}); save the file as "
                                  "UTF-8 (docs/evaluation.md)") from None
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if problem := _document_problem(task, doc):
                raise ConfigError(f"{path}:{n} is not {expected} ({problem}); rewrite the file from the dataset "
                                  "(docs/evaluation.md)")
            n_docs += 1
    if n_docs == 0:
        raise ConfigError(f"{path} holds no document; it must hold {expected}")
    return n_docs


def _strings(x) -> bool:
    return isinstance(x, list) and all(type(s) is str for s in x)


def _document_problem(task: str, doc) -> str | None:
    """What the stock task cannot use in a document (None if nothing): not an object, a field missing or of
    another type, or an answer that is none of the choices."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    fields = FIELDS.get(task, {})
    if missing := [k for k in fields if k not in doc]:
        return f"missing: {', '.join(missing)}"
    if wrong := [f"{k} is not {TYPE_NAMES[kind]}" for k, kind in fields.items() if type(doc[k]) is not kind]:
        return "; ".join(wrong)
    if task in ("arc_challenge", "arc_easy"):
        text, labels = doc["choices"].get("text"), doc["choices"].get("label")
        if not (_strings(text) and _strings(labels) and len(text) == len(labels)):
            return 'choices is not {"text": [...], "label": [...]}, two lists of strings of the same length'
        answer, allowed = "answerKey", labels
    elif task == "hellaswag":
        if not _strings(doc["endings"]):
            return "endings is not a list of strings"
        answer, allowed = "label", [str(i) for i in range(len(doc["endings"]))]
    elif task in ANSWERS:
        answer, allowed = ANSWERS[task]
    else:
        return None
    if doc[answer] not in allowed:
        return f"{answer} {doc[answer]!r} is none of {', '.join(map(repr, allowed)) or 'its choices'}"
    if task == "winogrande" and "_" not in doc["sentence"]:
        return "sentence holds no blank _ for the options"
    return None


@dataclasses.dataclass(frozen=True)
class CheckedTasks:
    """The tasks a --tasks list names, each with the config the harness builds it from (its data files checked),
    and the task index they were found in."""
    specs: list[TaskSpec]
    configs: list[dict]
    manager: object


def checked_tasks(task_text: str, data_dir: str | None, limit: int | None) -> CheckedTasks:
    """Parses a --tasks list and checks every data file it needs (nothing is read from a model)."""
    manager = task_manager(stock=needs_stock_tasks(task_text))
    specs = parse_tasks(task_text, manager.all_subtasks)
    return CheckedTasks(specs, [harness_config(s, data_dir, manager, limit) for s in specs], manager)


def harness_config(spec: TaskSpec, data_dir: str | None, task_manager, limit: int | None = None) -> dict:
    """The task config the harness builds the task from: the stock config with its data pointed at local files,
    or the built-in task's (with `limit` documents, when more than its default)."""
    if spec.name == builtin_task.TASK_NAME:
        n_docs = max(limit or 0, builtin_task.DEFAULT_DOCS)
        config = builtin_task.task_config(n_docs)
        _check_shots(spec.name, spec.shots, f"the built-in task with {n_docs} documents (--limit sets more)", n_docs)
        return {**config, "num_fewshot": spec.shots}
    from lm_eval.tasks._yaml_loader import load_yaml

    stock = load_yaml(task_manager.task_index[spec.name].yaml_path, resolve_func=True)
    if data_dir is None:
        raise ConfigError(f"--data-dir is required for {spec.name}: the harness's stock tasks read local files "
                          "DIR/<task>/<split>.jsonl (docs/evaluation.md)")
    files = data_files(stock, spec.name, data_dir, spec.shots)
    return {**stock, "dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": files},
            "num_fewshot": spec.shots}
