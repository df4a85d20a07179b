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
    (("--storage", "sqlite://", "--stop-at", "0.2"), "error: --storage sqlite://: an in-memory database"),
    (("--storage", "sqlite:///:memory:", "--stop-at", "0.2", "--workers", "2"),
     "error: --storage sqlite:///:memory:: an in-memory database"),
    (("--storage", "", "--stop-at", "0.2"), "error: --storage '': not a storage URL"),
    (("--storage", "sqlite:///x.db", "--workers", "2"), "error: --storage needs --stop-at F"),  # before any worker
])
def test_bad_study_input_gets_one_line(tmp_path, capsys, extra, message):
    assert cli.main(_sweep(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"celerity sweep: {message}") and err.count("\n") == 1
    assert not (tmp_path / "sweep").exists()


def test_a_worker_process_stops_on_an_error_in_one_line(tmp_path):
    from test_sweep_study import _spec

    from celerity_jax.cli import sweep

    with pytest.raises(SystemExit) as stopped:
        sweep._worker(_spec(str(tmp_path / "sweep"), stop_at=None), f"sqlite:///{tmp_path / 's.db'}", "s")
    assert stopped.value.code == ("celerity sweep: error: --storage needs --stop-at F: the fraction of training from "
                                  "which the collapse pruner may stop a setting, e.g. --stop-at 0.2")
