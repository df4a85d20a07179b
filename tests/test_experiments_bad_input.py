"""The experiments' report scripts refuse missing inputs with one line and write nothing."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script, args, says", [
    ("early_stop_sweep/report.py", ("--section", "τ", "{missing}"), "{missing}: no sweep.json; run the sweep there first"),
    ("surrogate/forms.py", ("--workdir", "{missing}", "--out", "{out}", "--sizes", "d48"),
     "forms.py: CURVE {missing}/d48_tau0.1_tpp6 does not exist"),
])
def test_a_missing_input_is_one_line_and_nothing_is_written(tmp_path, script, args, says):
    paths = {"missing": str(tmp_path / "missing"), "out": str(tmp_path / "out")}
    args = [a.format(**paths) for a in args]
    if "--out" not in args:
        args += ["--out", paths["out"]]
    result = _run(script, *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith(says.format(**paths))
    assert not os.path.exists(paths["out"])
