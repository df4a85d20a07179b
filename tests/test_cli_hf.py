"""`celerity export-hf` and `import-hf` on the trained tiny run (ALiBi, squared ReLU, LayerNorm, byte vocabulary): the
export computes the run's logits and greedy text in transformers, shards, carries the card; the import is a run
directory that eval, sample and TrainConfig.init_from read, with every parameter bit for bit. Bad input is one line
naming the problem and the fix, exit code 2, nothing written."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("safetensors")

from celerity_jax import run  # noqa: E402
from celerity_jax.cli import main  # noqa: E402
from celerity_jax.evaluate import loader, sampler  # noqa: E402
from celerity_jax.hf import export, fold  # noqa: E402
from celerity_jax.model import transformer  # noqa: E402

PROMPTS = ["def main(", "import os\nimport sys\n\nclass Päckchen:\n    ", "#"]


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("export") / "hf")
    assert main(["export-hf", "--workdir", trained_run, "--out", out]) == 0
    return out


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def transformers(torch):
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model(exported, torch, transformers):
    return transformers.AutoModelForCausalLM.from_pretrained(exported, trust_remote_code=True,
                                                             dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ours(trained_run):
    return loader.load_model(trained_run)


def test_export_writes_the_folder_and_card(exported, trained_run):
    files = set(os.listdir(exported))
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "README.md", "configuration_celerity.py", "modeling_celerity.py", fold.LOST_BITS} == files
    with open(os.path.join(exported, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(trained_run, "run.json")) as f:
        identity = json.load(f)
    assert config["celerity_model"] == identity["model"] and config["eos_token_id"] == 256
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_celerity.CelerityForCausalLM"
    with open(os.path.join(exported, "README.md")) as f:
        card = f.read()
    plan = identity["plan"]
    with open(os.path.join(trained_run, "curve.csv")) as f:
        last_loss = float(f.read().split()[-1].split(",")[-1])
    for fact in (f"| N (parameters) | {plan['n_params']:,} |", f"| TPP | {plan['tpp']:g} |",
                 f"| τ (AdamW timescale) | {plan['tau']:.4g} |", f"{last_loss:.4f} (step 114, `curve.csv`)",
                 "`eval.csv`", "No downstream scores at step 114", "exported untied."):
        assert fact in card


def test_logits_match(ours, hf_model, torch):
    tokens_BxL = np.random.default_rng(0).integers(0, 257, (2, ours.cfg.max_seq_len))
    logits = np.asarray(transformer.apply(ours.cfg, ours.params, jnp.asarray(tokens_BxL)))
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens_BxL)).logits.numpy()
    assert np.abs(theirs - logits).max() <= 1e-4 * np.abs(logits).max()


def test_greedy_text_matches_one_prompt_at_a_time_and_batched(ours, hf_model, exported, torch, transformers):
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, trust_remote_code=True)
    ids = [[int(t) for t in ours.tokenizer.encode_batch([p])[0]] for p in PROMPTS]
    assert [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS] == ids
    decoder = sampler.Decoder(ours.cfg, ours.params, ours.mesh)
    generations = sampler.generate(decoder, ours.tokenizer, ids, max_new_tokens=24)
    for prompt, g in zip(ids, generations):
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
        assert out[0, len(prompt):].tolist() == g.token_ids
        assert tokenizer.decode(g.token_ids) == g.text
    tokenizer.padding_side = "left"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    out = hf_model.generate(**batch, max_new_tokens=24, do_sample=False)
    assert [row[batch.input_ids.shape[1]:].tolist() for row in out] == [g.token_ids for g in generations]


def test_sharded_export_loads_the_same(ours, hf_model, tmp_path, torch, transformers):
    out = str(tmp_path / "sharded")
    summary = export.export(ours.cfg, ours.params, out, tokenizer=ours.tokenizer, max_shard_bytes=100_000)
    assert len(summary["weight_files"]) > 3
    with open(os.path.join(out, export.INDEX_FILE)) as f:
        index = json.load(f)
    assert sorted(set(index["weight_map"].values())) == summary["weight_files"]
    assert index["metadata"]["total_size"] == summary["bytes"]
    sharded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    for name, tensor in hf_model.state_dict().items():
        assert torch.equal(sharded.state_dict()[name], tensor), name


def test_card_holds_the_downstream_scores(trained_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(trained_run, run_dir)
    os.makedirs(os.path.join(run_dir, "downstream"))
    scores = {"step": 114, "n_params": 117072, "tokens": 58368, "train_flops": 4.5e10,
              "tasks": {"stdlib_next_line": {"metric": "acc", "value": 0.34, "stderr": 0.067, "docs": 50, "shots": 0,
                                             "truncated": 0}}}
    with open(os.path.join(run_dir, "downstream", "step_114.json"), "w") as f:
        json.dump(scores, f)
    out = str(tmp_path / "hf")
    assert main(["export-hf", "--workdir", run_dir, "--out", out, "--dtype", "bfloat16"]) == 0
    with open(os.path.join(out, "README.md")) as f:
        card = f.read()
    assert "| stdlib_next_line | acc | 34.00 | 6.70 | 0 | 50 | 0 |" in card and "in bfloat16" in card


def test_import_is_a_run_directory_with_the_same_parameters(ours, exported, tmp_path, capsys):
    out = str(tmp_path / "imported")
    assert main(["import-hf", "--model", exported, "--out", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lost_bits"] == ["unembed"] and summary["stale_bits"] == []
    back = loader.load_model(out)
    assert back.step == 0 and back.cfg == ours.cfg and back.tokenizer.name == "byte"
    original, imported = fold.flatten(ours.params), fold.flatten(back.params)
    assert all(np.array_equal(original[p].view(np.int32), imported[p].view(np.int32)) for p in original)


def test_a_run_starts_from_the_import(exported, tiny_gin, curve_losses, trained_run, tmp_path):
    imported = str(tmp_path / "imported")
    assert main(["import-hf", "--model", exported, "--out", imported, *sum((["--gin-file", g] for g in tiny_gin),
                                                                              [])]) == 0
    workdir = str(tmp_path / "finetune")
    spec = run.RunSpec(workdir, (*tiny_gin, os.path.join(imported, "model.gin")),
                       (f"TrainConfig.init_from = '{imported}'", "TrainConfig.stop_at_step = 2"))
    run.load(spec).train_to(log=lambda _: None)
    with open(os.path.join(workdir, "init_from.json")) as f:
        assert json.load(f)["step"] == 0
    losses = curve_losses(workdir)
    assert list(losses) == [1, 2] and losses[1] < max(curve_losses(trained_run).values()) - 1.0


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


def test_an_unwritable_json_path_is_refused_before_anything_is_written(trained_run, exported, tmp_path, capsys):
    json_path = str(tmp_path / "missing" / "summary.json")
    _refused(["export-hf", "--workdir", trained_run, "--out", str(tmp_path / "hf"), "--json", json_path], capsys,
             "export-hf", f"--json {json_path}", "is not an existing folder")
    _refused(["import-hf", "--model", exported, "--out", str(tmp_path / "run"), "--json", json_path], capsys,
             "import-hf", f"--json {json_path}", "is not an existing folder")


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
    (lambda c: c.update(model_type="llama"), "config.json: model_type='llama', but its celerity_model (which the "
                                             "weights fit) exports model_type='celerity'"),
    # config.json's own fields, which transformers reads, against the celerity_model the import reads
    (lambda c: c.update(vocab_size=300), "config.json: vocab_size=300, but its celerity_model (which the weights "
                                         "fit) exports vocab_size=257"),
    (lambda c: c.update(hidden_size=64), "config.json: hidden_size=64, but its celerity_model (which the weights "
                                         "fit) exports hidden_size=48"),
    (lambda c: c.update(hidden_size="48"), "config.json: hidden_size='48', but"),
    (lambda c: c.pop("positions"), "config.json: no positions, but its celerity_model (which the weights fit) "
                                   "exports positions='alibi'"),
    (lambda c: c.update(tie_word_embeddings=True), "config.json: tie_word_embeddings=True, but"),
])
def test_import_of_a_config_json_changed_after_the_export(exported, tmp_path, capsys, edit, needle):
    model = _copy(exported, tmp_path, edit_config=edit)
    if needle is None:  # a smaller vocabulary than the tokenizer's: the shapes are checked first
        needle = "has shape (257, 48), but config.json makes it (200, 48)"
    _refused(["import-hf", "--model", model, "--out", str(tmp_path / "run")], capsys, "import-hf", needle)


@pytest.mark.parametrize("file, damage, needle", [
    (fold.LOST_BITS, lambda b: b[:len(b) // 2], f"{fold.LOST_BITS} is damaged (BadZipFile: "),
    (fold.LOST_BITS, lambda b: b[:200] + bytes(200) + b[400:], f"{fold.LOST_BITS} is damaged ("),
    ("model.safetensors", lambda b: b[:len(b) // 2], "model.safetensors is not a readable safetensors file"),
    ("config.json", lambda b: b"[]", "config.json holds a JSON list, not a config object"),
    (export.INDEX_FILE, lambda b: b'{"weight_map": ["model.safetensors"]}', "is not a safetensors index"),
])
def test_import_of_a_damaged_file(exported, tmp_path, capsys, file, damage, needle):
    model = _copy(exported, tmp_path)
    path = tmp_path / "model" / file
    path.write_bytes(damage(path.read_bytes() if path.exists() else b""))
    _refused(["import-hf", "--model", model, "--out", str(tmp_path / "run")], capsys, "import-hf", needle)


def test_a_killed_export_is_never_imported_and_its_rerun_removes_it(trained_run, tmp_path, capsys):
    """Killed (SIGKILL) while it writes the tokenizer, an export leaves its partial folder beside --out: import-hf
    refuses it, and a copy of it (which lacks config.json, written last); the rerun removes it, but never the partial
    folder of a running export."""
    out = tmp_path / "hf"
    killed_midway = ("import os, signal, sys; from celerity_jax.hf import tokenizer_files; "
                     "tokenizer_files.write = lambda *_: os.kill(os.getpid(), signal.SIGKILL); "
                     "from celerity_jax.cli import main; main(sys.argv[1:])")
    export_hf = ["export-hf", "--workdir", trained_run, "--out", str(out)]
    killed = subprocess.Popen([sys.executable, "-c", killed_midway, *export_hf])
    assert killed.wait(timeout=300) == -signal.SIGKILL
    partial = tmp_path / f".hf.partial-{socket.gethostname()}-{killed.pid}"
    assert "model.safetensors" in os.listdir(partial) and not out.exists()
    runs = tmp_path / "runs"
    runs.mkdir()
    _refused(["import-hf", "--model", str(partial), "--out", str(runs / "a")], capsys, "import-hf",
             "is the unfinished folder of a command that was killed or is still running; give the finished hf")
    copied = shutil.copytree(partial, tmp_path / "copied")
    _refused(["import-hf", "--model", str(copied), "--out", str(runs / "b")], capsys, "import-hf",
             "has no config.json")
    running = tmp_path / f".hf.partial-{socket.gethostname()}-{os.getppid()}"
    running.mkdir()
    assert main(export_hf) == 0
    assert not partial.exists() and running.exists() and "config.json" in os.listdir(out)


def test_import_of_a_damaged_tokenizer_names_its_file(exported, tmp_path, capsys):
    model = _copy(exported, tmp_path, edit_config=lambda c: c.update(celerity_tokenizer="tokenizer.json"))
    (tmp_path / "model" / "tokenizer.json").write_text("{not json")
    _refused(["import-hf", "--model", model, "--out", str(tmp_path / "run")], capsys, "import-hf",
             f"{os.path.join(model, 'tokenizer.json')}' is not a readable HuggingFace tokenizer.json")


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
    ({**STOCK_LLAMA, "num_key_value_heads": 3}, "num_key_value_heads=3 does not divide num_attention_heads=4"),
    ({**STOCK_LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling="),
    ({**STOCK_LLAMA, "attention_bias": True}, "attention_bias=True differs from mlp_bias=False"),
    ({**STOCK_LLAMA, "hidden_act": "gelu"}, "hidden_act='gelu' is not SwiGLU's silu"),
    ({**STOCK_NEOX, "use_parallel_residual": True}, "use_parallel_residual=True runs attention and MLP in parallel"),
    ({**STOCK_NEOX, "rotary_pct": 0.25}, "rotary_pct=0.25 rotates part of each head"),
    ({**STOCK_NEOX, "hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is none of"),
    ({**STOCK_LLAMA, "model_type": "mistral"}, "model_type='mistral' is not importable"),
    ({**STOCK_LLAMA, "hidden_size": "32"}, "hidden_size='32' is not a positive integer"),
])
def test_import_of_a_stock_model_that_does_not_map(tmp_path, capsys, config, needle):
    folder = tmp_path / "stock"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    _refused(["import-hf", "--model", str(folder), "--out", str(tmp_path / "run")], capsys, "import-hf", needle)


GROUPED_QUERY_LLAMA = ["ModelConfig.positions = 'rope'", "ModelConfig.norm = 'rmsnorm'", "ModelConfig.mlp = 'swiglu'",
                       "ModelConfig.n_heads = 4", "ModelConfig.head_dim = 12", "ModelConfig.n_kv_heads = 2"]


@pytest.mark.slow
def test_a_grouped_query_llama_run_end_to_end(tiny_gin, tmp_path, capsys, torch, transformers):
    """Trained with 2 key/value heads for 4 heads, sampled greedily, exported to a stock LlamaForCausalLM whose
    greedy text is ours, and imported back bit for bit."""
    workdir, out, back = (str(tmp_path / name) for name in ("run", "hf", "back"))
    gin = sum((["--gin-file", g] for g in tiny_gin), []) + sum((["--gin-param", b] for b in GROUPED_QUERY_LLAMA), [])
    assert main(["train", *gin, "--workdir", workdir]) == 0
    capsys.readouterr()
    assert main(["sample", "--workdir", workdir, "--temperature", "0", "--max-new-tokens", "24", "--json",
                 *sum((["--prompt", p] for p in PROMPTS), [])]) == 0
    sampled = [s["completion"] for s in json.loads(capsys.readouterr().out)["samples"]]
    assert main(["export-hf", "--workdir", workdir, "--out", out]) == 0
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    hf_model = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    for prompt, text in zip(PROMPTS, sampled):
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        greedy = hf_model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
        assert tokenizer.decode(greedy, skip_special_tokens=True) == text
    assert main(["import-hf", "--model", out, "--out", back]) == 0
    ours, imported = loader.load_model(workdir), loader.load_model(back)
    assert imported.cfg.n_kv_heads == 2 and imported.cfg == ours.cfg
    original, returned = fold.flatten(ours.params), fold.flatten(imported.params)
    assert all(np.array_equal(original[p].view(np.int32), returned[p].view(np.int32)) for p in original)
