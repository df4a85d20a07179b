"""The built-in downstream task: its documents come from the held-out stdlib files, and lm_eval builds it offline."""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from celerity_jax.data import corpus  # noqa: E402
from celerity_jax.data.config import DataConfig  # noqa: E402
from celerity_jax.evaluate import builtin_task  # noqa: E402

N_DOCS = 200


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return builtin_task.documents(N_DOCS)


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    """Every standard-library file's text by corpus key (files that are not UTF-8 left out)."""
    out = {}
    for key, path in corpus.stdlib_files():
        try:
            with open(path, encoding="utf-8", newline="") as f:
                out[key] = f.read()
        except UnicodeDecodeError:
            pass
    return out


def _load(**metadata):
    from lm_eval.tasks import TaskManager

    # The stock tasks (include_defaults) take about 10 s to index and play no part in building an inline config.
    manager = TaskManager(include_defaults=False, metadata=metadata or None)
    return manager.load([builtin_task.task_config(20)])["tasks"][builtin_task.TASK_NAME]


@pytest.fixture(scope="module")
def task():
    return _load()


def test_documents_are_deterministic_and_shaped(docs):
    assert builtin_task.documents(N_DOCS) == docs
    assert builtin_task.documents(N_DOCS, seed=1) != docs
    assert builtin_task.documents(7) == docs[:7]
    assert len(docs) == N_DOCS
    for doc in docs:
        choices = doc["choices"]
        assert len(choices) == 4 and len(set(choices)) == 4, doc
        assert all(c.strip() for c in choices), doc
        assert doc["label"] in range(4)
    labels = [doc["label"] for doc in docs]
    assert all(labels.count(k) > N_DOCS // 8 for k in range(4)), labels
    assert len({doc["source"] for doc in docs}) >= 15


def test_documents_fit_the_byte_budget(docs):
    for doc in docs:
        for choice in doc["choices"]:
            assert len((doc["context"] + choice).encode("utf-8")) <= builtin_task.MAX_BYTES, doc


def test_documents_are_held_out_places_with_their_true_continuation(docs, texts):
    val_fraction = DataConfig().val_fraction
    train = "\n".join(["", *(text for key, text in texts.items() if not corpus.is_validation(key, val_fraction)), ""])
    for doc in docs:
        assert corpus.is_validation(doc["source"], val_fraction), doc["source"]
        truth = doc["choices"][doc["label"]]
        assert "\n" + doc["context"] + truth + "\n" in "\n" + texts[doc["source"]] + "\n", doc
        assert doc["context"].count("\n") >= 1, doc
        target_line = doc["context"].rsplit("\n", 1)[1] + truth
        assert "\n" + target_line + "\n" not in train, target_line
        for distractor in doc["choices"]:
            if distractor != truth:
                assert distractor in texts[doc["source"]] and distractor not in doc["context"], doc


def test_lm_eval_builds_the_task_offline(task):
    expected = builtin_task.documents(20)
    docs = list(task.test_docs())
    assert [d["context"] for d in docs] == [d["context"] for d in expected]
    assert task.OUTPUT_TYPE == "multiple_choice" and task.VERSION == builtin_task.VERSION
    doc = docs[3]
    assert task.doc_to_text(doc) == expected[3]["context"]
    assert task.doc_to_choice(doc) == expected[3]["choices"]
    assert task.doc_to_target(doc) == expected[3]["label"]


def test_lm_eval_scores_each_choice_as_the_direct_continuation(task):
    task.build_all_requests(limit=None, rank=0, world_size=1)
    assert len(task.instances) == 20 * 4
    for instance in task.instances:
        doc = instance.doc
        assert instance.arguments == (doc["context"], doc["choices"][instance.idx])
    doc = task.instances[0].doc
    truth_best = [(-1.0 if k == doc["label"] else -9.0, False) for k in range(4)]
    assert task.process_results(doc, truth_best) == {"acc": 1.0, "acc_norm": 1.0}
    wrong_best = [(-1.0 if k == (doc["label"] + 1) % 4 else -9.0, False) for k in range(4)]
    assert task.process_results(doc, wrong_best) == {"acc": 0.0, "acc_norm": 0.0}


def test_lm_eval_metadata_sets_the_number_of_documents():
    assert len(_load(n_docs=5).test_docs()) == 5
