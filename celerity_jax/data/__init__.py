"""Token streams for training and evaluation: built-in stdlib corpus, user text, ArrayRecord shards."""

from celerity_jax.data.config import DataConfig
from celerity_jax.data.pipeline import (TrainIterator, check_seq_len, check_vocab, corpus_stats,
                                        make_eval_batches, make_train_iterator, tokenizer_vocab_size)

__all__ = ["DataConfig", "TrainIterator", "check_seq_len", "check_vocab", "corpus_stats", "make_eval_batches",
           "make_train_iterator", "tokenizer_vocab_size"]
