"""`stdlib_next_line`: a multiple-choice lm-evaluation-harness task made from the held-out stdlib files, offline.

The demo's models see nothing but Python source, so their downstream probe is Python source they did not see:
which of four endings completes a line of a held-out file.

A document is a place in a held-out file. Its context is the preceding lines (whole lines, from
MIN_CONTEXT_BYTES to CONTEXT_LINES_BYTES) and the start of the target line: its indentation and first third,
extended to the end of the word it falls in. The four choices are the rest of that line and three distractors:
rests of other target lines of the same file, of about the same byte length (within LENGTH_TOLERANCE), neither
in the context nor within FAR_LINES of the target; all four are distinct and hold a letter or digit.
Distractors from the same file share its style and names, so the file alone does not tell the truth apart: the
context must be read. The choice order is shuffled per document: chance is 25%, for acc and acc_norm alike.

The files are exactly those the trainer holds out (the hash split of `celerity_jax.data.corpus` with the
default DataConfig), read as it reads them, and no target line appears (stripped) in a training file.
Trivial lines are no targets: blank or comment-only, shorter than MIN_LINE_CHARS without indentation,
longer than MAX_LINE_BYTES, or a rest without a letter or digit; lines seen in training also rule out the
most repeated ones (`return None`). Context plus the longest choice stays within MAX_BYTES UTF-8 bytes,
inside a 256-byte context window. The documents depend only on the Python installation and the seed.
"""

import bisect
import functools
import itertools
import random

from celerity_jax.data import corpus, sources
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError
from celerity_jax.evaluate import offline  # noqa: F401  (before datasets: building the task never downloads)

import datasets  # noqa: E402

TASK_NAME = "stdlib_next_line"
VERSION = 1.0
DEFAULT_DOCS = 500
N_CHOICES = 4
MAX_BYTES = 220  # context + longest choice
CONTEXT_LINES_BYTES = 160
MIN_CONTEXT_BYTES = 60
MIN_LINE_CHARS = 20  # without indentation
MAX_LINE_BYTES = 80
MIN_REST_BYTES = 8
FAR_LINES = 20  # distractors: lines of the same file more than this many lines away
LENGTH_TOLERANCE = 0.2  # distractors' byte length: the truth's +-20% (at least +-2 bytes)


def _n_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _cut(line: str) -> int | None:
    """Where the choice starts in a target line, or None for a line that is no target."""
    body = line.lstrip()
    if (line != line.rstrip() or len(body) < MIN_LINE_CHARS or _n_bytes(line) > MAX_LINE_BYTES
            or body.startswith("#")):
        return None
    k = len(body) // 3
    while k < len(body) and _is_word(body[k - 1]) and _is_word(body[k]):
        k += 1
    cut = len(line) - len(body) + k
    rest = line[cut:]
    if _n_bytes(rest) < MIN_REST_BYTES or not any(c.isalnum() for c in rest):
        return None
    return cut


@functools.lru_cache(maxsize=1)
def _candidates() -> tuple[list[tuple[str, list[str]]], list[list[tuple[int, int, int]]],
                           list[list[tuple[int, str, int]]]]:
    """The held-out files as (key, lines); per file, its targets as (file, line, cut) and its distractor pool.

    A file's pool holds (byte length, rest, line) of each of its targets, sorted, for a search by length.
    """
    val_fraction = DataConfig().val_fraction
    held_out, seen = [], set()
    bad = sources.BadRecords()
    for key, path in corpus.stdlib_files():
        for piece in sources.file_pieces(path, key):
            for doc_key, text in sources.read_piece(piece, "text", "skip", bad):
                if corpus.is_validation(doc_key, val_fraction):
                    held_out.append((doc_key, text.split("\n")))
                else:
                    seen.update(line.strip() for line in text.split("\n"))
    targets, pools = [], []
    for f, (_, lines) in enumerate(held_out):
        targets.append([])
        pools.append([])
        for i, line in enumerate(lines):
            cut = _cut(line)
            if cut is not None and line.strip() not in seen:
                targets[f].append((f, i, cut))
                pools[f].append((_n_bytes(line[cut:]), line[cut:], i))
        pools[f].sort()
    return held_out, targets, pools


def _distractors(rng: random.Random, pool: list[tuple[int, str, int]], truth: str, tolerance: int, i: int,
                 context: str) -> list[str] | None:
    """N_CHOICES - 1 distinct rests within `tolerance` bytes of the truth's length, or None.

    A distractor is not in the context (a model would be drawn to copy it) nor from a line near line i.
    """
    n = _n_bytes(truth)
    lo = bisect.bisect_left(pool, (n - tolerance,))
    hi = bisect.bisect_left(pool, (n + tolerance + 1,))
    picked = []
    for j in rng.sample(range(lo, hi), hi - lo):
        _, rest, line = pool[j]
        if abs(line - i) > FAR_LINES and rest != truth and rest not in picked and rest not in context:
            picked.append(rest)
            if len(picked) == N_CHOICES - 1:
                return picked
    return None


def _document(rng: random.Random, f: int, i: int, cut: int) -> dict | None:
    held_out, _, pools = _candidates()
    key, lines = held_out[f]
    prefix, truth = lines[i][:cut], lines[i][cut:]
    tolerance = max(2, round(_n_bytes(truth) * LENGTH_TOLERANCE))
    budget = min(CONTEXT_LINES_BYTES, MAX_BYTES - _n_bytes(prefix) - _n_bytes(truth) - tolerance)
    start, used = i, 0
    while start > 0 and used + _n_bytes(lines[start - 1]) + 1 <= budget:
        start -= 1
        used += _n_bytes(lines[start]) + 1
    if used < MIN_CONTEXT_BYTES:
        return None
    context = "".join(line + "\n" for line in lines[start:i]) + prefix
    distractors = _distractors(rng, pools[f], truth, tolerance, i, context)
    if distractors is None:
        return None
    choices = [truth, *distractors]
    rng.shuffle(choices)
    return {"context": context, "choices": choices, "label": choices.index(truth), "source": key}


def documents(n_docs: int = DEFAULT_DOCS, seed: int = 0) -> list[dict]:
    """`n_docs` documents {"context", "choices", "label", "source" (the file's corpus key)}; ConfigError past the
    supply.

    Targets are taken round-robin over the held-out files (in a seeded order, each file's targets shuffled),
    so they spread over all files rather than crowd into the largest.
    """
    _, targets, _ = _candidates()
    rng = random.Random(seed)
    files = [rng.sample(t, len(t)) for t in targets]
    rng.shuffle(files)
    docs = []
    for target in itertools.chain.from_iterable(itertools.zip_longest(*files)):
        if target is not None and (doc := _document(rng, *target)) is not None:
            docs.append(doc)
            if len(docs) == n_docs:
                return docs
    raise ConfigError(f"{TASK_NAME}: asked for {n_docs} documents, this Python installation's held-out standard "
                      f"library gives {len(docs)}; ask for fewer (--limit, TrainConfig.downstream_limit)")


def _dataset(n_docs: int, seed: int, **metadata) -> datasets.DatasetDict:
    # lm_eval passes the task's whole metadata as keyword arguments: n_docs and seed (task_config's, or those of
    # TaskManager(metadata=...), `lm_eval --metadata`), and its version and bookkeeping, which change no document.
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(documents(n_docs, seed))})


def task_config(n_docs: int = DEFAULT_DOCS) -> dict:
    """The task for `lm_eval.tasks.TaskManager().load([task_config()])`: built in memory, no download.

    Zero-shot; each choice is scored as the direct continuation of the context (no delimiter between them).
    acc: the choice of highest log-likelihood is the truth; acc_norm: the same per character of choice.
    """
    return {
        "task": TASK_NAME,
        "output_type": "multiple_choice",
        "custom_dataset": _dataset,
        "test_split": "test",
        "doc_to_text": "context",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "target_delimiter": "",
        "num_fewshot": 0,
        "metric_list": [{"metric": name, "aggregation": "mean", "higher_is_better": True}
                        for name in ("acc", "acc_norm")],
        "metadata": {"version": VERSION, "n_docs": n_docs, "seed": 0},
    }
