import json

from celerity_jax import cli


def test_prepare_data_writes_shards_and_says_how_to_train_on_them(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": f"record {i} " * 20}) + "\n" for i in range(30)))
    out = tmp_path / "shards"
    assert cli.main(["prepare-data", "--input", str(tmp_path / "a.jsonl"), "--text-field", "body",
                     "--out", str(out), "--chunk-tokens", "256"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.splitlines()[1])
    meta = json.load(open(out / "meta.json"))
    assert summary["splits"]["train"]["tokens"] == meta["splits"]["train"]["tokens"] > 0
    assert meta["chunk_tokens"] == 256 and meta["source"]["text_field"] == "body"
    assert f"DataConfig.paths = ['{out}']" in printed


def test_prepare_data_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert cli.main(["prepare-data", "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "celerity prepare-data: error: DataConfig.paths" in err and "missing.txt" in err
    assert not (tmp_path / "o").exists()
