import json
import os

import pytest

from celerity_jax.cli import main


def test_greedy_sampling_is_repeatable_and_written_as_json(trained_run, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("import os\n\ndef main(\n")
    args = ["sample", "--workdir", trained_run, "--prompts-file", str(prompts), "--max-new-tokens", "12",
            "--stop", "\n", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert first["step"] == 114 and [s["prompt"] for s in first["samples"]] == ["import os", "def main("]
    for s in first["samples"]:
        assert "\n" not in s["completion"] and s["stopped"] in ("stop", "max_new_tokens", "end_of_text")
        assert s["new_tokens"] <= 12


def test_sampling_at_a_temperature_follows_the_seed(trained_run, capsys):
    def sample(seed):
        assert main(["sample", "--workdir", trained_run, "--step", "110", "--prompt", "x = ", "--temperature", "1.0",
                     "--top-p", "0.9", "--seed", str(seed), "--max-new-tokens", "24", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["samples"][0]["completion"]

    assert sample(1) == sample(1) and sample(1) != sample(2)


@pytest.mark.parametrize("args, message", [
    (["--prompt", "x" * 300], "prompt 1 is 300 tokens, and the model reads at most 256"),
    ([], "give prompts with --prompt TEXT (repeatable) or --prompts-file F"),
    (["--prompt", "a", "--prompts-file", "p.txt"], "give prompts with --prompt TEXT"),
    (["--prompt", "a", "--top-p", "0"], "--top-p=0.0 in (0, 1]"),
    (["--prompt", "a", "--temperature", "nan"], "--temperature=nan must be a finite number >= 0"),
    (["--prompt", "a", "--temperature", "inf"], "--temperature=inf must be a finite number >= 0"),
    (["--prompt", "a", "--seed", "1180591620717411303424"], "--seed=1180591620717411303424 must be a whole number"),
    (["--prompt", "a", "--stop", ""], "--stop got an empty string"),
    (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens=0 must be a positive whole number"),
])
def test_bad_input_gives_one_line(args, message, trained_run, capsys):
    before = sorted(os.listdir(trained_run))
    assert main(["sample", "--workdir", trained_run, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(os.listdir(trained_run)) == before
