"""Token streams for training and evaluation: built-in stdlib corpus, user files, ArrayRecord shards.

Modules: `config` (DataConfig), `sources` (the input formats: .txt, .jsonl(.gz/.zst), .parquet),
`tokenizer` (bytes, HuggingFace tokenizer.json, SentencePiece), `corpus` (documents, their split, the
tasks they are tokenized in, and the packed stream of each split), `prepare` (`celerity prepare-data` on
one machine: worker pool, resume, manifest; its progress line in `progress`), `beam` (the same as an
Apache Beam pipeline), `arrayrecord` (the shard folder: writer, manifest, reader) and `pipeline` (the
grain train iterator and held-out eval batches the trainer uses).
"""
