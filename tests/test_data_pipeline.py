import dataclasses
import json
import os
import warnings

import numpy as np
import pytest

from celerity_jax.data import corpus, pipeline, prepare
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError

L, B = 16, 8


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> DataConfig:
    """A small corpus whose every window of L + 1 tokens is unique, so batches can be located in it."""
    root = tmp_path_factory.mktemp("text")
    for i in range(12):
        (root / f"train{i:02d}.txt").write_text(" ".join(f"d{i}w{j:03d}" for j in range(40 + 9 * i)))
    (root / "val.txt").write_text(" ".join(f"v{j:04d}" for j in range(400)))
    return DataConfig(source="text", paths=(str(root / "train*.txt"),), val_paths=(str(root / "val.txt"),))


def _windows(stream: np.ndarray) -> dict[bytes, int]:
    """Window bytes -> index of every full window stream[i·L : i·L + L + 1]."""
    n = (stream.size - 1) // L
    out = {stream[i * L:i * L + L + 1].astype(np.int32).tobytes(): i for i in range(n)}
    assert len(out) == n
    return out


def _rows(batch) -> list[bytes]:
    seqs = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    return [row.tobytes() for row in seqs]


def _take(it, n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [next(it) for _ in range(n)]


def test_batches_are_shifted_int32_windows(cfg):
    batch = next(pipeline.make_train_iterator(cfg, L, B, seed=0))
    assert set(batch) == {"inputs", "targets"}
    for x in batch.values():
        assert x.shape == (B, L) and x.dtype == np.int32 and x.flags.c_contiguous
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])


def test_each_epoch_serves_every_window_once_in_a_new_order(cfg):
    stream = corpus.load_corpus(cfg).train
    index = _windows(stream)
    n = len(index)
    it = pipeline.make_train_iterator(cfg, L, B, seed=0)
    assert it.n_windows == n and n % B  # batches straddle the epoch boundary
    order = [index[r] for batch in _take(it, (2 * n) // B + 1) for r in _rows(batch)]
    first, second = order[:n], order[n:2 * n]
    assert sorted(first) == sorted(second) == list(range(n))
    assert first != second and first != sorted(first)
    # So every token but the first and the tail of (size - 1) mod L is a target once per epoch.
    assert stream.size - 1 - n * L == (stream.size - 1) % L < L


def test_order_depends_on_both_seeds_and_nothing_else(cfg):
    def rows(c, seed):
        return [r for b in _take(pipeline.make_train_iterator(c, L, B, seed=seed), 3) for r in _rows(b)]

    assert rows(cfg, 0) == rows(cfg, 0)
    assert rows(cfg, 0) != rows(cfg, 1)
    assert rows(cfg, 0) != rows(dataclasses.replace(cfg, shuffle_seed=5), 0)


@pytest.mark.parametrize("cut", [0, 1, 7, 14, 15, 16, 29, 31])
def test_restored_state_reproduces_the_uninterrupted_batches(cfg, cut):
    batch_seqs, total = 32, 34  # 486 windows: epoch 2 starts inside batch 15, epoch 3 inside batch 30
    reference = _take(pipeline.make_train_iterator(cfg, L, batch_seqs, seed=3), total)
    it = pipeline.make_train_iterator(cfg, L, batch_seqs, seed=3)
    assert it.n_windows == 486
    _take(it, cut)
    state = json.loads(json.dumps(it.get_state()))
    resumed = pipeline.make_train_iterator(cfg, L, batch_seqs, seed=3)
    resumed.set_state(state)
    for expected, got, cont in zip(reference[cut:], _take(resumed, total - cut), _take(it, total - cut),
                                   strict=True):
        for k in expected:
            np.testing.assert_array_equal(got[k], expected[k])
            np.testing.assert_array_equal(cont[k], expected[k])


def test_a_state_from_another_layout_is_refused(cfg):
    state = pipeline.make_train_iterator(cfg, L, B, seed=3).get_state()
    with pytest.raises(ConfigError, match="seq_len: 16 saved, 32 now"):
        pipeline.make_train_iterator(cfg, 2 * L, B, seed=3).set_state(state)
    with pytest.raises(ConfigError, match="seed: 3 saved, 4 now"):
        pipeline.make_train_iterator(cfg, L, B, seed=4).set_state(state)


def test_hosts_read_disjoint_rows_of_the_single_host_batch(cfg):
    single = _take(pipeline.make_train_iterator(cfg, L, 2 * B, seed=1), 8)
    hosts = [_take(pipeline.make_train_iterator(cfg, L, B, seed=1, process_index=p, process_count=2), 8)
             for p in range(2)]
    for k, batch in enumerate(single):
        for p in range(2):
            np.testing.assert_array_equal(hosts[p][k]["inputs"], batch["inputs"][p::2])
    host0 = pipeline.make_train_iterator(cfg, L, B, seed=1, process_index=0, process_count=2)
    _take(host0, 5)
    host1 = pipeline.make_train_iterator(cfg, L, B, seed=1, process_index=1, process_count=2)
    host1.set_state(host0.get_state())  # the primary host's saved state restores every host
    np.testing.assert_array_equal(next(host1)["inputs"], hosts[1][5]["inputs"])
    with pytest.raises(ConfigError, match="process_index=2"):
        pipeline.make_train_iterator(cfg, L, B, seed=1, process_index=2, process_count=2)


def test_past_the_end_warns_once_with_the_epoch(cfg):
    it = pipeline.make_train_iterator(cfg, L, B, seed=0)
    per_epoch = it.batches_per_epoch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(int(3 * per_epoch) + 1):
            next(it)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1
    assert f"batch {int(per_epoch)} starts epoch 2" in messages[0] and "allow_repeat" in messages[0]


def test_past_the_end_fails_without_repeat(cfg):
    it = pipeline.make_train_iterator(dataclasses.replace(cfg, allow_repeat=False), L, B, seed=0)
    full = int(it.batches_per_epoch)
    _take(it, full)
    with pytest.raises(ConfigError, match=f"used up at batch {full} and DataConfig.allow_repeat=False"):
        next(it)


def test_eval_batches_are_fixed_validation_windows(cfg):
    val_index = _windows(corpus.load_corpus(cfg).val)
    batches = pipeline.make_eval_batches(cfg, L, B, 3)
    assert len(batches) == 3
    rows = [r for b in batches for r in _rows(b)]
    assert all(r in val_index for r in rows) and len(set(rows)) == 3 * B
    again = pipeline.make_eval_batches(cfg, L, B, 3)
    assert all((a["inputs"] == b["inputs"]).all() for a, b in zip(batches, again))
    split = [pipeline.make_eval_batches(cfg, L, B // 2, 3, process_index=p, process_count=2) for p in range(2)]
    np.testing.assert_array_equal(split[1][2]["targets"], batches[2]["targets"][1::2])
    with pytest.raises(ConfigError, match="fewer than the 100 eval batches"):
        pipeline.make_eval_batches(cfg, L, B, 100)


def test_corpus_stats_report_the_size_in_tokens(cfg):
    stats = pipeline.corpus_stats(cfg)
    loaded = corpus.load_corpus(cfg)
    assert (stats["train_tokens"], stats["val_tokens"]) == (loaded.train.size, loaded.val.size)
    assert stats["files"] == 13 and stats["tokenizer"] == "byte" and stats["skipped"] == 0


def test_a_corpus_shorter_than_one_sequence_is_an_error(cfg):
    with pytest.raises(ConfigError, match="fewer than one sequence of 100001"):
        pipeline.make_train_iterator(cfg, 100_000, 1, seed=0)


def test_vocab_check():  # the sequence length is checked by recipe.make_plan (tests/test_recipe.py)
    pipeline.check_vocab(257, 257)
    pipeline.check_vocab(50257, 50304)  # a vocabulary padded to a round size
    with pytest.raises(ConfigError, match="257 token ids but ModelConfig.vocab_size=256.*at least 257"):
        pipeline.check_vocab(pipeline.tokenizer_vocab_size(DataConfig()), 256)


def test_a_celerity_config_on_the_built_in_corpus_is_told_what_corpus_it_needs(repo_root, tmp_path):
    from celerity_jax import gin_config
    from celerity_jax.configs import RunDefinition
    from celerity_jax.train import loop

    configs = gin_config.parse_gin([os.path.join(repo_root, "experiments/celerity/300m_20tpp.gin")])
    with pytest.raises(ConfigError) as raised:
        loop.train(RunDefinition.of(configs), str(tmp_path / "run"), log=lambda _: None)
    message = str(raised.value)
    assert message.startswith("ModelConfig.vocab_size=128,256 is made for another tokenizer than the data's ('byte' "
                              "tokenizer of the built-in corpus: 257 token ids)")
    assert "Llama-3 tokenizer" in message and "celerity prepare-data --input FILES --tokenizer" in message
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def shards(cfg, tmp_path_factory) -> DataConfig:
    """The `cfg` corpus prepared as ArrayRecord shards."""
    out = tmp_path_factory.mktemp("shards") / "out"
    prepare.prepare(cfg, str(out), chunk_tokens=50)
    return DataConfig(source="arrayrecord", paths=(str(out),))


def test_read_workers_serve_the_in_process_batches_and_resume_exactly(shards):
    batch_seqs, cut, total = 32, 9, 34  # 486 windows: epochs 2 and 3 start inside batches 15 and 30
    reference = _take(pipeline.make_train_iterator(shards, L, batch_seqs, seed=3), total)
    it = pipeline.make_train_iterator(dataclasses.replace(shards, read_workers=2), L, batch_seqs, seed=3)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = [next(it) for _ in range(cut)]
            state = it.get_state()
            rest = [next(it) for _ in range(total - cut)]
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(messages) == 1 and "batch 15 starts epoch 2" in messages[0]
        it.set_state(state)  # the workers have read past `cut`: set_state must drop that
        resumed = _take(it, total - cut)
    finally:
        it.close()
        it.close()
    for expected, got in zip(reference + reference[cut:], first + rest + resumed, strict=True):
        assert set(got) == set(expected)
        for k in expected:
            np.testing.assert_array_equal(got[k], expected[k])
