"""A model from a run directory: its parameters at a saved step (without the optimizer state), its ModelConfig
and its tokenizer, on a device mesh. Sampling, scoring, the harness and the Hugging Face export start here."""

import ast
import dataclasses
import json
import os
import re

import jax

from celerity_jax import rundir
from celerity_jax.data.config import DataConfig
from celerity_jax.data.tokenizer import load_tokenizer
from celerity_jax.errors import ConfigError
from celerity_jax.model import sharding, transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.rundir import checkpoint


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    workdir: str
    step: int
    cfg: ModelConfig    # the run's, with unscanned layers (what the KV cache needs)
    params: dict        # on `mesh`, laid out by the sharding rules
    tokenizer: object   # celerity_jax.data.tokenizer's interface
    mesh: jax.sharding.Mesh
    plan: dict          # the run's plan.json
    identity: dict      # the run's run.json

    @property
    def max_len(self) -> int:
        """The longest token sequence the model reads."""
        return self.cfg.max_seq_len


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {what} {path} ({e}); --workdir must be a run directory written by "
                          "`celerity train`") from None


def saved_step(workdir: str, step: int | None) -> int:
    """`step` if the run saved a checkpoint there, else the newest when `step` is None; refuses otherwise."""
    steps = checkpoint.checkpoint_steps(os.path.join(workdir, rundir.CHECKPOINTS))
    if not steps:
        raise ConfigError(f"{workdir} holds no checkpoint; train the run first (`celerity train`) or point "
                          "--workdir at a run that saved one")
    if step is None:
        return steps[-1]
    if step not in steps:
        shown = ", ".join(map(str, steps[-8:]))
        raise ConfigError(f"{workdir} has no checkpoint at step {step}; its saved steps are {shown}: pass one of "
                          "them to --step, or leave --step out for the newest")
    return step


def run_model_config(identity: dict, workdir: str) -> ModelConfig:
    try:
        return ModelConfig(**identity["model"])
    except (KeyError, TypeError, ConfigError) as e:
        raise ConfigError(f"the model in {rundir.run_json_path(workdir)} is not readable by this version "
                          f"({e}); use the celerity_jax version that trained the run") from None


def run_tokenizer(identity: dict, workdir: str):
    """The tokenizer the run trained with, as its DataConfig names it."""
    try:
        data = DataConfig(**identity["data"])
        tokenizer = load_tokenizer(data.tokenizer, data.separator_token)
    except (KeyError, TypeError, ConfigError) as e:
        raise ConfigError(f"the tokenizer of the run in {workdir} cannot be loaded ({e}); run from the directory "
                          "the run was trained in, or put its tokenizer file back at that path") from None
    return tokenizer


def run_mesh(workdir: str) -> jax.sharding.Mesh:
    """The mesh shape the run trained with, over this host's devices. Its plan and identity leave out how it ran
    (TrainConfig, which may change when a run resumes), so the shape is the TrainConfig.mesh_shape line of the
    config.gin its last start wrote, read as text: parsing the file with gin would replace the caller's gin
    configuration. A run trained through the library without an operative config has no config.gin; it loads
    data-parallel over every device."""
    path = os.path.join(workdir, rundir.CONFIG_GIN)
    if not os.path.exists(path):
        return sharding.make_mesh((-1, 1, 1))
    try:
        with open(path) as f:
            line = re.search(r"^TrainConfig\.mesh_shape\s*=(.*)$", f.read(), re.MULTILINE)
        shape = ast.literal_eval(line.group(1).strip()) if line else None
    except (OSError, ValueError, SyntaxError) as e:
        raise ConfigError(f"cannot read the run's mesh shape from {path} ({e}); --workdir must be a run directory "
                          "written by `celerity train`") from None
    if not (isinstance(shape, tuple) and len(shape) == 3 and all(type(size) is int for size in shape)):
        raise ConfigError(f"{path} records no mesh shape (a line `TrainConfig.mesh_shape = (data, fsdp, tensor)`); "
                          "put back the config.gin the run wrote")
    return sharding.make_mesh(shape)


def load_model(workdir: str, step: int | None = None, mesh: jax.sharding.Mesh | None = None) -> LoadedModel:
    """The run's parameters at `step` (default: the newest checkpoint), checked against their checksums, on `mesh`
    (default: the run's own mesh shape)."""
    if not os.path.isdir(workdir):
        problem = "is a file, not a folder" if os.path.exists(workdir) else "does not exist"
        raise ConfigError(f"--workdir {workdir} {problem}; give a run directory written by `celerity train`")
    identity = _read_json(rundir.run_json_path(workdir), "the run's identity")
    plan = _read_json(os.path.join(workdir, rundir.PLAN_JSON), "the run's plan")
    cfg = run_model_config(identity, workdir)
    tokenizer = run_tokenizer(identity, workdir)
    step = saved_step(workdir, step)
    mesh = mesh or run_mesh(workdir)
    abstract = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    like = sharding.with_shardings(abstract, sharding.param_shardings(transformer.declarations(cfg), abstract, mesh))
    params = checkpoint.read_params(os.path.join(workdir, rundir.CHECKPOINTS), step, like)
    cfg, params = transformer.unstack_layers(cfg, params)
    return LoadedModel(workdir, step, cfg, params, tokenizer, mesh, plan, identity)
