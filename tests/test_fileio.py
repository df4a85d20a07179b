import os

import pytest

from celerity_jax.errors import ConfigError
from celerity_jax.fileio import (check_input_file, check_local_path, check_output_dir, check_output_file,
                                 write_json_atomic, write_text_atomic)


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


def _refused(check, path, flag: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as e:
        check(str(path), flag)
    assert str(e.value).startswith(f"{flag} {path}") and "\n" not in str(e.value)


def _chmod_or_skip(path, mode: int, denied: int) -> None:
    path.chmod(mode)
    if os.access(path, denied):
        pytest.skip("permissions do not restrict this user (root)")


def test_check_input_file_names_the_problem(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    check_input_file(str(tmp_path / "a.txt"), "--reference")
    _refused(check_input_file, tmp_path / "missing.txt", "--reference", "does not exist; check the path")
    _refused(check_input_file, tmp_path / "a.txt" / "sub", "--reference", "does not exist")
    _refused(check_input_file, tmp_path, "--reference", "is a folder, not a file")
    os.mkfifo(tmp_path / "pipe")
    _refused(check_input_file, tmp_path / "pipe", "--reference", "is not a regular file")


def test_check_input_file_refuses_an_unreadable_file(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    _chmod_or_skip(tmp_path / "a.txt", 0o200, os.R_OK)
    _refused(check_input_file, tmp_path / "a.txt", "--reference", "is not readable")


def test_check_output_dir_accepts_folders_that_exist_or_can_be_made(tmp_path):
    check_output_dir(str(tmp_path), "--workdir")
    check_output_dir(str(tmp_path / "new" / "deeper"), "--workdir")  # the caller creates missing parents
    (tmp_path / "f").write_text("x")
    _refused(check_output_dir, tmp_path / "f", "--workdir", "is a file, not a folder; give a new or existing folder")
    _refused(check_output_dir, tmp_path / "f" / "sub", "--workdir", f"{tmp_path / 'f'} is a file, not a folder, so "
                                                                    "no folder can be made under it")


def test_check_output_dir_refuses_read_only_folders(tmp_path):
    (tmp_path / "ro").mkdir()
    _chmod_or_skip(tmp_path / "ro", 0o500, os.W_OK)
    _refused(check_output_dir, tmp_path / "ro", "--out", "is not writable")
    _refused(check_output_dir, tmp_path / "ro" / "new", "--out", f"the folder {tmp_path / 'ro'} is not writable")


def test_check_output_file(tmp_path):
    check_output_file(str(tmp_path / "fig.png"), "--out")
    _refused(check_output_file, tmp_path, "--out", "is a folder; give a file path")
    _refused(check_output_file, tmp_path / "no" / "fig.png", "--out", "is not an existing folder")
    _refused(check_output_file, f"{tmp_path}/", "--out", "names no file; give a file path")
