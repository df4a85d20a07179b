"""Bad input to export-hf and import-hf: one line naming the problem and the fix, exit code 2, nothing written."""

import json
import os
import shutil

import pytest

pytest.importorskip("safetensors")

from celerity_jax.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("export") / "hf")
    assert main(["export-hf", "--workdir", trained_run, "--out", out]) == 0
    return out


def _refused(argv, capsys, command: str, *needles: str) -> None:
    out_dir = argv[argv.index("--out") + 1]
    existed = os.path.exists(out_dir) and os.listdir(out_dir)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"celerity {command}: error: "), err
    for needle in needles:
        assert needle in err, err
    parent = os.path.dirname(os.path.abspath(out_dir))
    assert not any(".partial-" in name for name in os.listdir(parent))
    if not existed:
        assert not os.path.exists(out_dir) or os.listdir(out_dir) == []


def _copy(folder, tmp_path, edit_config=None, drop=()):
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    for name in drop:
        os.remove(copy / name)
    if edit_config:
        with open(copy / "config.json") as f:
            config = json.load(f)
        edit_config(config)
        with open(copy / "config.json", "w") as f:
            json.dump(config, f)
    return str(copy)


def test_export_of_a_run_without_checkpoint(trained_run, tmp_path, capsys):
    run_dir = tmp_path / "untrained"
    run_dir.mkdir()
    for name in ("run.json", "plan.json", "config.gin"):
        shutil.copy(os.path.join(trained_run, name), run_dir / name)
    _refused(["export-hf", "--workdir", str(run_dir), "--out", str(tmp_path / "hf")], capsys, "export-hf",
             "holds no checkpoint")


def test_export_into_a_folder_that_is_not_empty(trained_run, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    _refused(["export-hf", "--workdir", trained_run, "--out", str(tmp_path / "hf")], capsys, "export-hf",
             "is not empty")
    assert os.listdir(tmp_path / "hf") == ["keep.txt"]


def test_import_into_a_folder_that_is_not_empty(exported, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    _refused(["import-hf", "--model", exported, "--out", str(tmp_path / "run")], capsys, "import-hf", "is not empty")


@pytest.mark.parametrize("drop, needle", [
    (("config.json",), "has no config.json"),
    (("model.safetensors",), "has neither model.safetensors nor model.safetensors.index.json"),
    (("tokenizer.json", "tokenizer_config.json"), None),  # an export of the byte tokenizer needs no file
])
def test_import_of_a_folder_with_a_missing_file(exported, tmp_path, capsys, drop, needle):
    model = _copy(exported, tmp_path, drop=drop)
    argv = ["import-hf", "--model", model, "--out", str(tmp_path / "run")]
    if needle is None:
        assert main(argv) == 0
    else:
        _refused(argv, capsys, "import-hf", needle)


def test_import_of_a_missing_shard(trained_run, tmp_path, capsys):
    from celerity_jax.evaluate import loader
    from celerity_jax.hf import export

    model = loader.load_model(trained_run)
    folder = str(tmp_path / "sharded")
    summary = export.export(model.cfg, model.params, folder, tokenizer=model.tokenizer, max_shard_bytes=100_000)
    os.remove(os.path.join(folder, summary["weight_files"][1]))
    _refused(["import-hf", "--model", folder, "--out", str(tmp_path / "run")], capsys, "import-hf",
             f"the weight file {summary['weight_files'][1]} named by its index is missing")


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c["celerity_model"].update(vocab_size=300), "tensor model.embed_tokens.weight has shape (257, 48), "
                                                          "but config.json makes it (300, 48)"),
    (lambda c: c["celerity_model"].update(d_model=64, n_heads=4), "has shape"),
    (lambda c: c["celerity_model"].update(vocab_size=200), None),
    (lambda c: c.update(model_type="llama"), "model_type='llama' is not the class its celerity_model exports to"),
])
def test_import_of_a_vocabulary_or_shape_that_does_not_match(exported, tmp_path, capsys, edit, needle):
    model = _copy(exported, tmp_path, edit_config=edit)
    if needle is None:  # a smaller vocabulary than the tokenizer's: the shapes are checked first
        needle = "has shape (257, 48), but config.json makes it (200, 48)"
    _refused(["import-hf", "--model", model, "--out", str(tmp_path / "run")], capsys, "import-hf", needle)


def test_import_of_a_tokenizer_larger_than_the_vocabulary(exported, tmp_path, capsys):
    from tokenizers import Tokenizer

    model = _copy(exported, tmp_path, edit_config=lambda c: c.update(celerity_tokenizer="tokenizer.json"))
    tokenizer = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save(os.path.join(model, "tokenizer.json"))
    _refused(["import-hf", "--model", model, "--out", str(tmp_path / "run")], capsys, "import-hf",
             "the folder's tokenizer has 258 token ids but the model's vocabulary holds 257")


STOCK_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 257, "hidden_size": 32,
               "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
STOCK_NEOX = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": 257, "hidden_size": 32,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "max_position_embeddings": 64, "hidden_act": "gelu", "rotary_pct": 1.0, "use_parallel_residual": False}


@pytest.mark.parametrize("config, needle", [
    ({**STOCK_LLAMA, "num_key_value_heads": 2}, "num_key_value_heads=2 differs from num_attention_heads=4 "
                                                "(grouped-query attention)"),
    ({**STOCK_LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling="),
    ({**STOCK_LLAMA, "attention_bias": True}, "attention_bias=True differs from mlp_bias=False"),
    ({**STOCK_LLAMA, "hidden_act": "gelu"}, "hidden_act='gelu' is not SwiGLU's silu"),
    ({**STOCK_NEOX, "use_parallel_residual": True}, "use_parallel_residual=True runs attention and MLP in parallel"),
    ({**STOCK_NEOX, "rotary_pct": 0.25}, "rotary_pct=0.25 rotates part of each head"),
    ({**STOCK_NEOX, "hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is none of"),
    ({**STOCK_LLAMA, "model_type": "mistral"}, "model_type='mistral' is not importable"),
])
def test_import_of_a_stock_model_that_does_not_map(tmp_path, capsys, config, needle):
    folder = tmp_path / "stock"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    _refused(["import-hf", "--model", str(folder), "--out", str(tmp_path / "run")], capsys, "import-hf", needle)
