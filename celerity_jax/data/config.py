"""DataConfig: where the tokens come from, how they are tokenized and in what order they are served."""

import dataclasses

from celerity_jax.config_types import check_field_types
from celerity_jax.errors import ConfigError

SOURCES = ("stdlib", "text", "arrayrecord")
ON_BAD_RECORD = ("skip", "fail")
# `celerity prepare-data`'s defaults: tokens per ArrayRecord record, and per shard group (see `prepare`).
DEFAULT_CHUNK_TOKENS = 4096
DEFAULT_SHARD_TOKENS = 1 << 26


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Every field gin can bind by name, e.g. `DataConfig.source = "text"`.

    source: "stdlib" (the running interpreter's standard library, no download), "text" (`paths` are
      .txt, .jsonl, .jsonl.gz, .jsonl.zst or .parquet files, globs or folders) or "arrayrecord" (`paths`
      holds one `celerity prepare-data` output folder, local or gs://).
    val_paths: for "text", files that form the validation split; empty splits `paths` by a hash of
      each document's key (a whole file: its path; a .jsonl line: path and line number; a Parquet
      row: path and row number).
    text_column: the .jsonl key or Parquet column holding each document's text.
    tokenizer: "byte" (256 bytes + an end-of-text separator), a HuggingFace `tokenizer.json` file or a
      SentencePiece `.model` file. For "arrayrecord" it must be the tokenizer the shards were made with:
      its SHA-256 is checked against the folder's manifest.
    separator_token: the token placed after every document; empty picks the tokenizer's own
      end-of-text token.
    shuffle_seed: combined with the trainer's seed to order the training sequences.
    allow_repeat: past the end of the training split, start another epoch (with one warning) or
      raise ConfigError.
    on_bad_record: a malformed record (a binary or undecodable text file, a .jsonl line that is not a
      JSON object with a string `text_column`, a Parquet row whose text is null, a compressed or Parquet
      file that cannot be read) is skipped and counted ("skip"), or stops with its file and row ("fail").
    read_workers: "arrayrecord" only: grain worker processes that read and assemble batches ahead of the
      trainer; 0 reads in the training process.
    """

    source: str = "stdlib"
    paths: tuple[str, ...] = ()
    val_paths: tuple[str, ...] = ()
    text_column: str = "text"
    tokenizer: str = "byte"
    separator_token: str = ""
    val_fraction: float = 0.05
    shuffle_seed: int = 0
    allow_repeat: bool = True
    on_bad_record: str = "skip"
    read_workers: int = 0

    def __post_init__(self):
        check_field_types(self)  # also turns the lists gin and JSON hand over into tuples: the config keys a cache
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the field, the problem and the fix."""
        if self.source not in SOURCES:
            raise ConfigError(f"DataConfig.source={self.source!r} is not one of {SOURCES}")
        if self.source == "stdlib" and (self.paths or self.val_paths):
            raise ConfigError("DataConfig.paths/val_paths are set but DataConfig.source='stdlib' reads the "
                              "standard library; set source='text' to read your files, or clear the paths")
        if self.source != "stdlib" and not self.paths:
            raise ConfigError(f"DataConfig.source={self.source!r} needs DataConfig.paths (files, globs or "
                              "folders for 'text'; the prepare-data output folder for 'arrayrecord')")
        if self.source == "arrayrecord" and (len(self.paths) != 1 or self.val_paths):
            raise ConfigError("DataConfig.source='arrayrecord' takes exactly one folder in DataConfig.paths "
                              "(the output of `celerity prepare-data`, which holds both splits) and no val_paths")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"DataConfig.val_fraction={self.val_fraction} must lie strictly between 0 and 1")
        if self.on_bad_record not in ON_BAD_RECORD:
            raise ConfigError(f"DataConfig.on_bad_record={self.on_bad_record!r} is not one of {ON_BAD_RECORD}")
        if not self.text_column:
            raise ConfigError("DataConfig.text_column is empty; name the .jsonl key or Parquet column that holds "
                              "the text")
        if self.read_workers < 0:
            raise ConfigError(f"DataConfig.read_workers={self.read_workers} must be 0 (read in the training "
                              "process) or a positive number of worker processes")
        if self.read_workers and self.source != "arrayrecord":
            raise ConfigError(f"DataConfig.read_workers={self.read_workers} needs DataConfig.source='arrayrecord' "
                              f"(source {self.source!r} is packed in memory, where batches cost microseconds); "
                              "set read_workers = 0")
