import os

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import check_local_path, write_json_atomic, write_text_atomic


def test_write_text_atomic_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "a.txt"
    write_text_atomic(str(path), "old")
    write_text_atomic(str(path), "new")
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "a.json"
    write_json_atomic(str(path), {"x": 1})
    with pytest.raises(TypeError):
        write_json_atomic(str(path), {"x": object()})
    assert path.read_text().strip().replace(" ", "").replace("\n", "") == '{"x":1}'
    assert os.listdir(tmp_path) == ["a.json"]


def test_check_local_path_refuses_urls_only():
    check_local_path("/mnt/bucket/run", "workdir")
    check_local_path("runs/demo", "workdir")
    with pytest.raises(ConfigError, match="workdir='gs://b/run' is a URL.*gcsfuse"):
        check_local_path("gs://b/run", "workdir")
