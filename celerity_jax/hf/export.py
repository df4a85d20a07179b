"""A model as a Hugging Face folder: safetensors weights (through safetensors' numpy API: no torch needed), sharded
past `max_shard_bytes` with a model.safetensors.index.json; config.json (with the run's ModelConfig as
`celerity_model`), generation_config.json, the tokenizer files, the model card, and for the custom class its code.

The core takes (cfg, params); `celerity export-hf` feeds it a run's checkpoint (`loader.load_model`).
"""

import dataclasses
import json
import os
import shutil

import ml_dtypes
import numpy as np

from celerity_jax.errors import ConfigError
from celerity_jax.hf import card, fold, layouts, outdir, tokenizer_files
from celerity_jax.model import transformer
from celerity_jax.model.config import ModelConfig

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
MAX_SHARD_BYTES = 5 * 10**9  # transformers' default shard size
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
REMOTE_CODE = ("configuration_celerity.py", "modeling_celerity.py")


def write_weights(tensors: dict[str, np.ndarray], out_dir: str, max_shard_bytes: int) -> list[str]:
    """model.safetensors, or shards of at most max_shard_bytes (a larger tensor alone in its shard) and the index."""
    from safetensors.numpy import save_file

    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, t in tensors.items():
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = np.ascontiguousarray(t)  # safetensors writes the buffer as it lies, whatever the strides
        size += t.nbytes
    files = ([SINGLE_FILE] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    umask = os.umask(0)
    os.umask(umask)
    for file, shard in zip(files, shards):
        save_file(shard, os.path.join(out_dir, file), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, file), 0o666 & ~umask)  # safetensors creates its files private
    if len(shards) == 1:
        return files
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
             "weight_map": {name: file for file, shard in zip(files, shards) for name in shard}}
    _write_json(os.path.join(out_dir, INDEX_FILE), index)
    return files + [INDEX_FILE]


def export(cfg: ModelConfig, params: dict, out: str, *, tokenizer, dtype: str = "float32",
           run_lines: list[str] = (), max_shard_bytes: int = MAX_SHARD_BYTES) -> dict:
    """Writes the folder `out` (new or empty) for the model (cfg, params) and its tokenizer; `run_lines` are the
    card's lines about the run. Returns what was written."""
    outdir.check_empty(out, "--out")
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} is not one of {', '.join(DTYPES)}; pick one of those")
    tokenizer_kind = tokenizer_files.kind(tokenizer)
    arch = layouts.architecture(cfg)
    unscanned, params = transformer.unstack_layers(cfg, params)
    folded = fold.fold(unscanned, params)
    tensors = {name: t.astype(DTYPES[dtype]) for name, t in layouts.to_hf(unscanned, arch, folded).items()}
    # a bfloat16 export rounds away far more than these bits
    lost = fold.lost_bits(unscanned, params, folded) if dtype == "float32" else {}
    config = {**layouts.hf_config(cfg, arch, dtype=dtype, eos_id=tokenizer.separator_id),
              "celerity_model": dataclasses.asdict(cfg), "celerity_tokenizer": tokenizer_kind}
    eos = tokenizer.separator_id
    with outdir.building(out, "--out") as folder:
        files = write_weights(tensors, folder, max_shard_bytes)
        if lost:
            fold.save_lost_bits(os.path.join(folder, fold.LOST_BITS), cfg, lost, folded)
        _write_json(os.path.join(folder, "generation_config.json"),
                    {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos, "do_sample": False})
        if arch == "celerity":
            for name in REMOTE_CODE:
                shutil.copyfile(os.path.join(os.path.dirname(__file__), name), os.path.join(folder, name))
        note = tokenizer_files.write(tokenizer, folder)
        with open(os.path.join(folder, "README.md"), "w") as f:
            f.write(card.model_card(cfg, arch, dtype=dtype, tokenizer_note=note, run_lines=list(run_lines),
                                    lost_values=sum(int(m.sum()) for m in lost.values())))
        # last: a folder holding config.json holds every other file whole (a killed export's partial folder has none)
        _write_json(os.path.join(folder, "config.json"), config)
    return {"out": out, "class": layouts.CLASSES[arch], "dtype": dtype, "tensors": len(tensors),
            "weight_files": [f for f in files if f != INDEX_FILE],
            "bytes": sum(t.nbytes for t in tensors.values()), "lost_bits": {p: int(m.sum()) for p, m in lost.items()}}


def _write_json(path: str, data) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
