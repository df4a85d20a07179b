import os

import pytest

from celerity_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "experiments", "tiny")


def _sweep(tmp_path, *extra) -> list[str]:
    return ["sweep", "--model", os.path.join(TINY, "d64.gin"), "--reference-model", os.path.join(TINY, "d48.gin"),
            "--sweep", "RecipeConfig.tau=0.3,0.9", "--workdir", str(tmp_path / "sweep"), *extra]


@pytest.mark.parametrize("extra, message", [
    (("--workers", "2"), "error: --workers and --study-name apply to a study: add --storage URL"),
    (("--storage", "sqlite:///x.db"), "error: --storage needs --stop-at F"),
    (("--storage", "sqlite:///x.db", "--stop-at", "0.2", "--shared-references"),
     "error: --shared-references with --storage: several workers would train the shared references at once"),
    (("--storage", "postgresql://nobody@127.0.0.1:1/db", "--stop-at", "0.2"),
     "error: --storage postgresql://nobody@127.0.0.1:1/db: cannot open it"),
    (("--storage", "journal:/nonexistent/dir/s.log", "--stop-at", "0.2"),
     "error: --storage journal:/nonexistent/dir/s.log: cannot open it"),
])
def test_bad_study_input_gets_one_line(tmp_path, capsys, extra, message):
    assert cli.main(_sweep(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"celerity sweep: {message}") and err.count("\n") == 1
