"""`celerity eval` end to end on the trained tiny run: the paper's seven tasks on small local files in their real
schemas (a few documents per split, written here), the built-in task, and bad input."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from celerity_jax.cli import main
from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import harness, loader, results, tasks
from celerity_jax.model import transformer

WORDS = "the cat sat on a mat while dogs ran over hills and birds sang in tall green trees".split()


def _text(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def _document(task: str, rng, i: int) -> dict:
    if task.startswith("arc"):
        return {"id": f"q{i}", "question": _text(rng, 6) + "?", "answerKey": "ABCD"[i % 4],
                "choices": {"text": [_text(rng, 2) for _ in range(4)], "label": list("ABCD")}}
    if task == "boolq":
        return {"question": _text(rng, 5), "passage": _text(rng, 20), "idx": i, "label": i % 2}
    if task == "hellaswag":
        return {"ind": i, "activity_label": _text(rng, 2), "ctx_a": _text(rng, 8), "ctx_b": _text(rng, 2),
                "ctx": "", "endings": [_text(rng, 4) for _ in range(4)], "source_id": f"s{i}", "split": "val",
                "split_type": "indomain", "label": str(i % 4)}
    if task == "piqa":
        return {"goal": _text(rng, 6), "sol1": _text(rng, 5), "sol2": _text(rng, 5), "label": i % 2}
    if task == "social_iqa":
        return {"context": _text(rng, 10), "question": _text(rng, 5) + "?", "answerA": _text(rng, 2),
                "answerB": _text(rng, 2), "answerC": _text(rng, 2), "label": str(1 + i % 3)}
    assert task == "winogrande"
    return {"sentence": f"{_text(rng, 4)} _ {_text(rng, 4)}.", "option1": _text(rng, 1), "option2": _text(rng, 1),
            "answer": str(1 + i % 2)}


def write_task_files(data_dir, task_manager) -> None:
    """DIR/<task>/<split>.jsonl for the preset's tasks: 26 training documents (enough for 25 shots), 3 in the
    other splits."""
    from lm_eval.tasks._yaml_loader import load_yaml

    rng = np.random.default_rng(0)
    for task, _ in tasks.PRESETS["celerity"]:
        stock = load_yaml(task_manager.task_index[task].yaml_path)
        os.makedirs(os.path.join(data_dir, task), exist_ok=True)
        for key in tasks.SPLIT_KEYS:
            if split := stock.get(key):
                with open(os.path.join(data_dir, task, f"{split}.jsonl"), "w") as f:
                    for i in range(26 if key == "training_split" else 3):
                        f.write(json.dumps(_document(task, rng, i)) + "\n")


@pytest.fixture(scope="module")
def task_manager():
    return tasks.task_manager()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, task_manager) -> str:
    path = str(tmp_path_factory.mktemp("tasks"))
    write_task_files(path, task_manager)
    return path


@pytest.fixture(scope="module")
def evaluated(trained_run, data_dir, tmp_path_factory):
    """A copy of the trained run's files, scored on the preset (step 114) and on the built-in task (step 110)."""
    import shutil

    workdir = str(tmp_path_factory.mktemp("eval") / "run")
    shutil.copytree(trained_run, workdir)
    assert main(["eval", "--workdir", workdir, "--tasks", "celerity", "--data-dir", data_dir]) == 0
    assert main(["eval", "--workdir", workdir, "--step", "110", "--tasks", "stdlib_next_line", "--limit", "20"]) == 0
    return workdir


def test_the_paper_preset_runs_end_to_end_and_is_recorded(evaluated):
    with open(results.result_path(evaluated, 114)) as f:
        content = json.load(f)
    assert set(content["tasks"]) == {name for name, _ in tasks.PRESETS["celerity"]}
    for name, shots in tasks.PRESETS["celerity"]:
        score = content["tasks"][name]
        assert score["metric"] == tasks.METRICS[name] and score["shots"] == shots and score["docs"] == 3
        assert 0.0 <= score["value"] <= 1.0
    assert content["tasks"]["arc_challenge"]["truncated"] > 0  # 25 shots do not fit 256 bytes
    assert content["average"]["value"] == pytest.approx(np.mean([s["value"] for s in content["tasks"].values()]))
    plan = json.load(open(os.path.join(evaluated, "plan.json")))
    assert content["tokens"] == 114 * plan["batch_tokens"] and content["n_params"] == plan["n_params"]
    assert content["train_flops"] == pytest.approx(content["tokens"] * plan["flops_per_token"])


def test_scores_reach_tensorboard(evaluated):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(evaluated)
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"downstream/arc_easy/acc_norm", "downstream/boolq/acc", "downstream/average",
            "downstream/stdlib_next_line/acc"} <= set(tags)
    assert [e.step for e in events.Scalars("downstream/stdlib_next_line/acc")] == [110]


def test_the_builtin_task_needs_no_data_dir(evaluated):
    with open(results.result_path(evaluated, 110)) as f:
        content = json.load(f)
    assert list(content["tasks"]) == ["stdlib_next_line"] and content["tasks"]["stdlib_next_line"]["docs"] == 20
    assert "average" not in content


@pytest.fixture(scope="module")
def lm(trained_run):
    model = loader.load_model(trained_run)
    return harness.CelerityLM(model.cfg, model.params, model.mesh, model.tokenizer, batch_size=4), model


class _Request:
    def __init__(self, *args):
        self.args = args


def _logprob_alone(model, context: list[int], continuation: list[int]) -> float:
    """log p(continuation | context) from one unpadded forward."""
    tokens = context + continuation
    logits = transformer.apply(model.cfg, model.params, jnp.asarray([tokens[:-1]]))[0]
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    return float(sum(logprobs[i, tokens[i + 1]] for i in range(len(context) - 1, len(tokens) - 1)))


def test_rolling_loglikelihood_scores_every_token_once(lm):
    from lm_eval import utils as lm_utils

    adapter, model = lm
    short = "import os\n"
    tokens = adapter.tok_encode(short)
    expected = _logprob_alone(model, [adapter.eot_token_id], tokens)
    assert adapter.loglikelihood_rolling([_Request(short)])[0] == pytest.approx(expected, abs=1e-4)
    long = "import os\nprint(os.getcwd())\n" * 12  # longer than the 256-byte context: two windows
    tokens = adapter.tok_encode(long)
    windows = [lm_utils.make_disjoint_window(w) for w in lm_utils.get_rolling_token_windows(
        token_list=tokens, prefix_token=adapter.eot_token_id, max_seq_len=model.max_len, context_len=1)]
    assert len(windows) == 2 and sum(len(cont) for _, cont in windows) == len(tokens)
    expected = sum(_logprob_alone(model, list(ctx), list(cont)) for ctx, cont in windows)
    assert adapter.loglikelihood_rolling([_Request(long)])[0] == pytest.approx(expected, abs=1e-3)


def test_generate_until_stops_at_the_task_strings(lm):
    adapter, model = lm
    out = adapter.generate_until([_Request("def f(x):\n", {"until": ["\n"], "max_gen_toks": 30}),
                                  _Request("import", {"until": ["zzz"], "max_gen_toks": 5})])
    assert "\n" not in out[0] and len(out[1].encode()) <= 5


def test_a_tokenizer_that_cannot_decode_is_refused_for_generation():
    class Lossy:
        name = "lossy.json"

        def encode_batch(self, texts):
            return [np.asarray([1, 2, 3])]

        def decode(self, ids):
            return "?"

    with pytest.raises(ConfigError, match="cannot decode what it encodes"):
        harness.check_can_decode(Lossy())


@pytest.mark.parametrize("args, message", [
    (["--tasks", "hellaswagg"], "unknown task 'hellaswagg'; did you mean hellaswag"),
    (["--tasks", "piqa", "--data-dir", "MISSING_TASK"], "piqa/train.jsonl is missing"),
    (["--tasks", "boolq", "--data-dir", "MALFORMED"], "validation.jsonl:4 is not one JSON object per line with the "
                                                      "fields passage, question, label (missing: passage)"),
    (["--tasks", "boolq"], "--data-dir is required for boolq"),
    (["--tasks", "stdlib_next_line", "--step", "7"], "has no checkpoint at step 7"),
])
def test_bad_input_gives_one_line_and_writes_nothing(args, message, trained_run, data_dir, tmp_path, capsys):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(os.path.join(data_dir, "boolq"), bad / "boolq")
    with open(bad / "boolq" / "validation.jsonl", "a") as f:
        f.write(json.dumps({"question": "q", "label": 1}) + "\n")
    args = [str(bad) if a == "MALFORMED" else str(tmp_path) if a == "MISSING_TASK" else a for a in args]
    before = sorted(os.listdir(trained_run))
    assert main(["eval", "--workdir", trained_run, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(os.listdir(trained_run)) == before


def test_a_run_without_checkpoints_or_tokenizer_is_refused(trained_run, tmp_path, capsys):
    import shutil

    empty = tmp_path / "empty"
    shutil.copytree(trained_run, empty, ignore=shutil.ignore_patterns("checkpoints"))
    assert main(["eval", "--workdir", str(empty), "--tasks", "stdlib_next_line"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    lost = tmp_path / "lost"
    shutil.copytree(trained_run, lost)
    identity = json.load(open(lost / "run.json"))
    identity["data"]["tokenizer"] = str(tmp_path / "gone.json")
    json.dump(identity, open(lost / "run.json", "w"))
    assert main(["sample", "--workdir", str(lost), "--prompt", "x"]) == 2
    assert "the tokenizer of the run" in capsys.readouterr().err


def test_a_bpe_tokenizer_decodes_and_one_without_its_decoder_is_refused(tmp_path):
    from celerity_jax.data.tokenizer import HFTokenizer, train_bpe

    path = train_bpe(["Hello world, 42 times. " * 50, "def f(x):\n    return x\n" * 50], 300, str(tmp_path / "t.json"))
    harness.check_can_decode(HFTokenizer(path, ""))
    spec = json.load(open(path))
    spec["decoder"] = None
    json.dump(spec, open(tmp_path / "raw.json", "w"))
    with pytest.raises(ConfigError, match="cannot decode what it encodes"):
        harness.check_can_decode(HFTokenizer(str(tmp_path / "raw.json"), ""))
