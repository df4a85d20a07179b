"""Token streams for training and evaluation: built-in stdlib corpus, user text, ArrayRecord shards.

Modules: `config` (DataConfig), `tokenizer` (bytes, HuggingFace tokenizer.json, SentencePiece), `corpus`
(reading and packing documents into one token stream per split), `arrayrecord` (pre-tokenized shards,
written by `celerity prepare-data`, the command in `celerity_jax/cli/data.py`) and `pipeline` (the grain
train iterator and held-out eval batches the trainer uses).
"""
