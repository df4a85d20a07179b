"""Documents of corpus files: plain text, JSON Lines (plain, gzip or zstd) and Parquet.

A file is read in pieces (the whole file, or one Parquet row group) so that the work can be spread over
processes. A document's key is its file's key, followed for JSON Lines by `:line` (1-based) and for Parquet
by `:row` (0-based). A malformed record is counted in a BadRecords, or stops the read when on_bad is "fail".
"""

import dataclasses
import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from celerity_jax.errors import ConfigError

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
MAX_EXAMPLES = 10
ZSTD_CHUNK = 1 << 20


def expand_paths(patterns: tuple[str, ...], field: str) -> list[str]:
    """Files named by paths, globs (`**` recurses) and folders (their SUFFIXES files, recursively)."""
    found: dict[str, None] = {}  # insertion-ordered set: the first mention of a file fixes its place
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise ConfigError(f"DataConfig.{field}: the glob {pattern!r} matches no file; check the pattern "
                                  "(relative paths start at the working directory)")
        elif os.path.isdir(pattern):
            matches = sorted(os.path.join(folder, name) for folder, _, files in os.walk(pattern)
                             for name in files if name.endswith(SUFFIXES))
            if not matches:
                raise ConfigError(f"DataConfig.{field}: the folder {pattern!r} holds no {', '.join(SUFFIXES)} "
                                  "file; name its files or a glob to read other files as plain text")
        elif os.path.isfile(pattern):
            matches = [pattern]
        else:
            raise ConfigError(f"DataConfig.{field}: {pattern!r} does not exist; give existing files, globs or "
                              "folders")
        found.update(dict.fromkeys(matches))
    return list(found)


@dataclasses.dataclass(frozen=True)
class Piece:
    """A part of one file that is read as a unit: the whole file, or one Parquet row group."""

    path: str
    key: str  # the file's key for the hash split (the path as given; stdlib: path below the stdlib)
    n_bytes: int  # for scheduling and progress: the file size, or the row group's compressed size
    row_group: int = -1  # Parquet row group index; -1 = whole file
    first_row: int = 0  # Parquet: the file row number of the group's first row


def file_pieces(path: str, key: str) -> list[Piece]:
    """One Piece per Parquet row group, else (or if the Parquet footer is unreadable) one for the whole file."""
    whole_file = [Piece(path, key, os.path.getsize(path))]
    if not path.endswith(".parquet"):
        return whole_file
    try:
        metadata = pq.read_metadata(path)
    except (pa.ArrowException, OSError):
        return whole_file  # read_piece reports the file as bad
    pieces, first_row = [], 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        n_bytes = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        pieces.append(Piece(path, key, n_bytes, index, first_row))
        first_row += group.num_rows
    return pieces


@dataclasses.dataclass
class BadRecords:
    """Malformed records met while reading: counted, with the first MAX_EXAMPLES described."""

    count: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def add(self, what: str, on_bad: str) -> None:
        """Count the record described by `what`, or raise ConfigError when on_bad is "fail"."""
        if on_bad == "fail":
            raise ConfigError(f"{what}; fix or remove it, or set DataConfig.on_bad_record = 'skip' to skip such "
                              "records with a count")
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(what)

    def merge(self, other: "BadRecords") -> None:
        self.count += other.count
        self.examples = (self.examples + other.examples)[:MAX_EXAMPLES]


def read_piece(piece: Piece, text_column: str, on_bad: str, bad: BadRecords) -> Iterator[tuple[str, str]]:
    """(document key, text) of each record of the piece, in file order; malformed records go to `bad`."""
    if piece.path.endswith(".parquet"):
        yield from _parquet_documents(piece, text_column, on_bad, bad)
    elif piece.path.endswith(JSONL_SUFFIXES):
        yield from _jsonl_documents(piece, text_column, on_bad, bad)
    else:
        yield from _text_document(piece, on_bad, bad)


def _text_document(piece: Piece, on_bad: str, bad: BadRecords) -> Iterator[tuple[str, str]]:
    with open(piece.path, "rb") as f:
        data = f.read()
    if b"\x00" in data:
        bad.add(f"{piece.path}: binary", on_bad)
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad.add(f"{piece.path}: not UTF-8 at byte {e.start}", on_bad)
        return
    yield piece.key, text


def _unzstd(data: bytes) -> bytes:
    """Every frame of a zstd stream; ZstdError if it ends inside a frame (stream readers stop there silently)."""
    decompressor, frame, out = zstandard.ZstdDecompressor(), None, []
    # Fed in chunks: the input left after a frame is copied, which over a file of many frames would be quadratic.
    for start in range(0, len(data), ZSTD_CHUNK):
        rest = data[start:start + ZSTD_CHUNK]
        while rest:
            if frame is None:
                frame = decompressor.decompressobj()
            out.append(frame.decompress(rest))
            rest = b""
            if frame.eof:
                frame, rest = None, frame.unused_data
    if frame is not None:
        raise zstandard.ZstdError("the data ends inside a frame (truncated)")
    return b"".join(out)


def _jsonl_documents(piece: Piece, text_column: str, on_bad: str, bad: BadRecords) -> Iterator[tuple[str, str]]:
    # The whole file is decompressed first, so that no record of a corrupt or truncated archive is used.
    with open(piece.path, "rb") as f:
        data = f.read()
    try:
        if piece.path.endswith(".gz"):
            data = gzip.decompress(data)
        elif piece.path.endswith(".zst"):
            data = _unzstd(data)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
        kind = "gzip" if piece.path.endswith(".gz") else "zstd"
        bad.add(f"{piece.path}: not a readable {kind} file ({e})", on_bad)
        return
    for lineno, raw in enumerate(io.BytesIO(data), start=1):  # lines end at b"\n" only, as JSON Lines says
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            bad.add(f"{piece.path}:{lineno}: not UTF-8", on_bad)
            continue
        except json.JSONDecodeError as e:
            bad.add(f"{piece.path}:{lineno}: not JSON ({e.msg})", on_bad)
            continue
        text = record.get(text_column) if isinstance(record, dict) else None
        if not isinstance(text, str):
            bad.add(f"{piece.path}:{lineno}: no string field {text_column!r} (DataConfig.text_column)", on_bad)
            continue
        try:
            text.encode("utf-8")  # JSON can escape a lone surrogate, which no tokenizer can encode
        except UnicodeEncodeError:
            bad.add(f"{piece.path}:{lineno}: a lone surrogate escape in {text_column!r} is not UTF-8", on_bad)
            continue
        yield f"{piece.key}:{lineno}", text


def _check_text_column(schema: pa.Schema, path: str, text_column: str) -> None:
    """ConfigError unless the Parquet schema has a string column `text_column`."""
    fix = "name the text column in DataConfig.text_column"
    if text_column not in schema.names:
        raise ConfigError(f"{path} has no column {text_column!r} (its columns: {', '.join(schema.names)}); {fix}")
    kind = schema.field(text_column).type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_string_view(values)):
        raise ConfigError(f"{path}: column {text_column!r} holds {kind}, not strings; {fix}")


def _parquet_documents(piece: Piece, text_column: str, on_bad: str, bad: BadRecords) -> Iterator[tuple[str, str]]:
    try:
        with pq.ParquetFile(piece.path) as parquet:
            _check_text_column(parquet.schema_arrow, piece.path, text_column)
            if piece.row_group < 0:
                table = parquet.read(columns=[text_column])
            else:
                table = parquet.read_row_group(piece.row_group, columns=[text_column])
    except (pa.ArrowException, OSError) as e:
        bad.add(f"{piece.path}: not a readable Parquet file ({e})", on_bad)
        return
    for index, text in enumerate(table.column(0).to_pylist()):
        row = piece.first_row + index
        if text is None:
            bad.add(f"{piece.path} row {row}: null text", on_bad)
        else:
            yield f"{piece.key}:{row}", text
