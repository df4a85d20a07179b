import gzip
import io
import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from celerity_jax.data import sources
from celerity_jax.errors import ConfigError

JSONL = b'{"text": "first"}\n\n{"text": "s\xc3\xa9cond", "id": 2}\r\n{"text": ""}\n'
JSONL_DOCS = [("first", 1), ("s\u00e9cond", 3), ("", 4)]


def _read(path, text_column="text", on_bad="skip", key=None):
    """Every (key, text) of a file and the bad records met, reading its pieces in order."""
    bad = sources.BadRecords()
    docs = [doc for piece in sources.file_pieces(str(path), key or str(path))
            for doc in sources.read_piece(piece, text_column, on_bad, bad)]
    return docs, bad


def _zstd_stream(data: bytes) -> bytes:
    """zstd frames written by a streaming writer, which leaves the content size out of the header."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as writer:
        writer.write(data)
    return out.getvalue()


def test_folders_take_every_suffix_recursively_and_nothing_else(tmp_path):
    (tmp_path / "sub").mkdir()
    names = ["a.txt", "b.jsonl", "sub/c.jsonl.gz", "sub/d.jsonl.zst", "sub/e.parquet", "f.csv", "g.gz"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert sources.expand_paths((str(tmp_path),), "paths") == [
        str(tmp_path / n) for n in ["a.txt", "b.jsonl", "sub/c.jsonl.gz", "sub/d.jsonl.zst", "sub/e.parquet"]]


def test_globs_and_paths_keep_the_first_mention_of_a_file(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.txt", "sub/b.txt", "sub/c.csv"):
        (tmp_path / name).write_bytes(b"x")
    patterns = (str(tmp_path / "sub/c.csv"), str(tmp_path / "**/*.txt"), str(tmp_path / "a.txt"), str(tmp_path / "sub"))
    assert sources.expand_paths(patterns, "paths") == [
        str(tmp_path / "sub/c.csv"), str(tmp_path / "a.txt"), str(tmp_path / "sub/b.txt")]


@pytest.mark.parametrize("make_folder, pattern, message", [
    (False, "missing.txt", "DataConfig.val_paths: '{}' does not exist; give existing files, globs or folders"),
    (False, "*.nothing", "DataConfig.val_paths: the glob '{}' matches no file; check the pattern (relative paths "
                         "start at the working directory)"),
    (True, "empty", "DataConfig.val_paths: the folder '{}' holds no .txt, .jsonl, .jsonl.gz, .jsonl.zst, .parquet "
                    "file; name its files or a glob to read other files as plain text"),
])
def test_missing_paths_are_named_with_the_field(tmp_path, make_folder, pattern, message):
    path = tmp_path / pattern
    if make_folder:
        path.mkdir()
        (path / "notes.csv").write_bytes(b"x")
    with pytest.raises(ConfigError) as e:
        sources.expand_paths((str(path),), "val_paths")
    assert str(e.value) == message.format(path)


def test_a_text_file_or_unknown_suffix_is_one_document(tmp_path):
    (tmp_path / "a.txt").write_text("héllo\nworld\n")
    (tmp_path / "b.md").write_text("# title")
    (tmp_path / "empty.txt").write_bytes(b"")
    assert sources.file_pieces(str(tmp_path / "a.txt"), "k") == [sources.Piece(str(tmp_path / "a.txt"), "k", 13)]
    assert _read(tmp_path / "a.txt", key="a.txt") == ([("a.txt", "héllo\nworld\n")], sources.BadRecords())
    assert _read(tmp_path / "b.md", key="b.md")[0] == [("b.md", "# title")]
    assert _read(tmp_path / "empty.txt", key="e")[0] == [("e", "")]


def test_jsonl_plain_gzip_and_zstd_give_the_same_documents(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "ZSTD_CHUNK", 7)  # frame ends fall inside chunks and across them
    half = JSONL.index(b"\n\n") + 1
    files = {
        "a.jsonl": JSONL,
        "a.jsonl.gz": gzip.compress(JSONL[:half]) + gzip.compress(JSONL[half:]),
        "a.jsonl.zst": zstandard.ZstdCompressor().compress(JSONL),
        "b.jsonl.zst": _zstd_stream(JSONL[:half]) + zstandard.ZstdCompressor().compress(JSONL[half:]),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        docs, bad = _read(tmp_path / name, key="doc")
        assert docs == [(f"doc:{line}", text) for text, line in JSONL_DOCS], name
        assert bad == sources.BadRecords(), name


def test_jsonl_reads_the_named_column(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"body": "x", "text": 1}\n')
    assert _read(tmp_path / "a.jsonl", text_column="body", key="a") == ([("a:1", "x")], sources.BadRecords())


def _parquet(path, table, **kwargs):
    pq.write_table(table, str(path), **kwargs)
    return str(path)


def test_parquet_row_groups_are_pieces_with_their_first_rows(tmp_path):
    texts = [f"doc {i}" for i in range(7)]
    path = _parquet(tmp_path / "a.parquet", pa.table({"id": list(range(7)), "text": texts}), row_group_size=3)
    pieces = sources.file_pieces(path, "key")
    assert [(p.path, p.key, p.row_group, p.first_row) for p in pieces] == [
        (path, "key", 0, 0), (path, "key", 1, 3), (path, "key", 2, 6)]
    assert all(p.n_bytes > 0 for p in pieces)
    assert _read(path)[0] == [(f"{path}:{i}", t) for i, t in enumerate(texts)]
    bad = sources.BadRecords()
    assert list(sources.read_piece(pieces[1], "text", "fail", bad)) == [(f"key:{i}", texts[i]) for i in (3, 4, 5)]


def test_parquet_without_row_groups_has_no_pieces(tmp_path):
    path = str(tmp_path / "empty.parquet")
    pq.ParquetWriter(path, pa.schema([("text", pa.string())])).close()
    assert sources.file_pieces(path, path) == []


@pytest.mark.parametrize("column", [
    pa.array(["a", "b"], pa.large_string()),
    pa.array(["a", "b"], pa.string_view()),
    pa.array(["a", "b"]).dictionary_encode(),
])
def test_parquet_string_types_are_all_text(tmp_path, column):
    path = _parquet(tmp_path / "a.parquet", pa.table({"body": column}))
    assert _read(path, text_column="body", key="k") == ([("k:0", "a"), ("k:1", "b")], sources.BadRecords())


@pytest.mark.parametrize("columns, problem", [
    ({"id": [1], "content": ["x"]}, "{path} has no column 'text' (its columns: id, content)"),
    ({"text": [1, 2]}, "{path}: column 'text' holds int64, not strings"),
])
@pytest.mark.parametrize("on_bad", ["skip", "fail"])
def test_parquet_without_a_string_text_column_stops_in_either_mode(tmp_path, columns, problem, on_bad):
    path = _parquet(tmp_path / "a.parquet", pa.table(columns))
    with pytest.raises(ConfigError) as e:
        _read(path, on_bad=on_bad)
    fix = "; name the text column in DataConfig.text_column"
    assert str(e.value) == problem.format(path=path) + fix


def _corrupt_gzip(path):
    data = bytearray(gzip.compress(JSONL))
    data[-8] ^= 0xFF  # the CRC: every record decompresses, yet none may be used
    path.write_bytes(bytes(data))


def _truncated_zstd(path):
    path.write_bytes(zstandard.ZstdCompressor().compress(JSONL * 50)[:-6])


def _corrupt_parquet(path):
    path.write_bytes(b"PAR1 this is not a parquet file")


def _null_row_parquet(path):
    pq.write_table(pa.table({"text": ["a", None, "c"]}), str(path), row_group_size=2)


# name, contents (bytes or a writer), what each skipped record says (after "{path}"), the documents kept
BAD_INPUTS = [
    ("bad.jsonl", b'{"text": "a"}\n{"text": \n', [":2: not JSON (Expecting value)"], [(":1", "a")]),
    ("list.jsonl", b'["text"]\n{"text": "b"}\n', [":1: no string field 'text' (DataConfig.text_column)"], [(":2", "b")]),
    ("field.jsonl", b'{"body": "a"}\n{"text": 5}\n{"text": "c"}\n',
     [":1: no string field 'text' (DataConfig.text_column)", ":2: no string field 'text' (DataConfig.text_column)"], [(":3", "c")]),
    ("latin.jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', [":2: not UTF-8"], [(":1", "a")]),
    ("surrogate.jsonl", b'{"text": "\\ud800"}\n{"text": "\\ud83d\\ude00"}\n',
     [":1: a lone surrogate escape in 'text' is not UTF-8"], [(":2", "\U0001f600")]),
    ("bad.jsonl.gz", _corrupt_gzip, [": not a readable gzip file (CRC check failed)"], []),
    ("cut.jsonl.gz", gzip.compress(JSONL)[:-3],
     [": not a readable gzip file (Compressed file ended before the end-of-stream marker was reached)"], []),
    ("plain.jsonl.gz", JSONL, [": not a readable gzip file (Not a gzipped file (b'{\"'))"], []),
    ("cut.jsonl.zst", _truncated_zstd, [": not a readable zstd file (the data ends inside a frame (truncated))"], []),
    ("plain.jsonl.zst", JSONL, [": not a readable zstd file (zstd decompressor error: Unknown frame descriptor)"], []),
    ("bad.parquet", _corrupt_parquet, [": not a readable Parquet file ("], []),
    ("null.parquet", _null_row_parquet, [" row 1: null text"], [(":0", "a"), (":2", "c")]),
    ("bin.txt", b"ab\x00cd", [": binary"], []),
    ("latin.txt", b"caf\xe9 au lait", [": not UTF-8 at byte 3"], []),
]


def _write(tmp_path, name, contents):
    path = tmp_path / name
    if callable(contents):
        contents(path)
    else:
        path.write_bytes(contents)
    return str(path)


@pytest.mark.parametrize("name, contents, skipped, kept", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_records_are_skipped_with_a_count(tmp_path, name, contents, skipped, kept):
    path = _write(tmp_path, name, contents)
    docs, bad = _read(path)
    assert docs == [(path + suffix, text) for suffix, text in kept]
    assert bad.count == len(skipped) and len(bad.examples) == len(skipped)
    for example, expected in zip(bad.examples, skipped):
        assert example.startswith(path + expected) if expected.endswith("(") else example == path + expected


@pytest.mark.parametrize("name, contents, skipped, kept", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_records_stop_the_read_when_failing(tmp_path, name, contents, skipped, kept):
    path = _write(tmp_path, name, contents)
    with pytest.raises(ConfigError) as e:
        _read(path, on_bad="fail")
    assert re.fullmatch(re.escape(path + skipped[0]) + r".*; fix or remove it, or set DataConfig.on_bad_record = "
                        r"'skip' to skip such records with a count", str(e.value))


def test_corrupt_parquet_is_one_whole_file_piece(tmp_path):
    path = _write(tmp_path, "bad.parquet", _corrupt_parquet)
    assert sources.file_pieces(path, "k") == [sources.Piece(path, "k", os.path.getsize(path))]


def test_bad_records_keep_the_first_examples():
    bad = sources.BadRecords()
    for i in range(sources.MAX_EXAMPLES + 2):
        bad.add(f"a{i}", "skip")
    assert bad == sources.BadRecords(12, [f"a{i}" for i in range(10)])
    few, more = sources.BadRecords(2, ["b0", "b1"]), sources.BadRecords(20, [f"c{i}" for i in range(10)])
    few.merge(more)
    assert few == sources.BadRecords(22, ["b0", "b1"] + [f"c{i}" for i in range(8)])
    few.merge(sources.BadRecords(1, ["d"]))
    assert few.count == 23 and few.examples[-1] == "c7"
    overfull = sources.BadRecords(12, [f"e{i}" for i in range(12)])  # as built by hand, not by add
    overfull.merge(sources.BadRecords(1, ["f"]))
    assert overfull == sources.BadRecords(13, [f"e{i}" for i in range(10)])
    empty = sources.BadRecords()
    empty.merge(sources.BadRecords(3, ["x", "y", "z"]))
    assert empty == sources.BadRecords(3, ["x", "y", "z"])


def test_jsonl_lines_end_only_at_newlines(tmp_path):
    lines = [json.dumps({"text": f"doc\u2028{i}"}, ensure_ascii=False) for i in range(3)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _read(tmp_path / "a.jsonl", key="a")[0] == [(f"a:{i + 1}", f"doc\u2028{i}") for i in range(3)]
