"""The run directory of an imported model: what `loader.load_model` and TrainConfig.init_from read.

Its configs are those of the run that will start from it (gin files and bindings; without any, the defaults with
the sequence length capped at the model's context) with the imported ModelConfig and tokenizer bound over them; its
checkpoint at step 0 is the train state such a run starts with (fresh optimizer state, empty monitor curve, data
iterator at its start) holding the imported parameters.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp

from celerity_jax import gin_config, optim, recipe, rundir
from celerity_jax.data import pipeline
from celerity_jax.data.tokenizer import load_tokenizer
from celerity_jax.errors import ConfigError
from celerity_jax.model import completep
from celerity_jax.model.config import ModelConfig
from celerity_jax.rundir.checkpoint import Checkpointer
from celerity_jax.rundir.identity import Identity
from celerity_jax.train import step as step_lib

MODEL_GIN = "model.gin"


def bindings(cfg: ModelConfig, tokenizer: str, separator_token: str) -> list[str]:
    """Gin bindings of the model and its tokenizer."""
    return ([f"ModelConfig.{f.name} = {getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg)]
            + [f"DataConfig.tokenizer = {tokenizer!r}", f"DataConfig.separator_token = {separator_token!r}"])


def write(folder: str, cfg: ModelConfig, params: dict, *, tokenizer: str, separator_token: str, tokenizer_now: str,
          gin_files=(), gin_params=()) -> dict:
    """Writes the run files and the step-0 checkpoint into `folder`. `tokenizer` is the DataConfig.tokenizer the run
    records (where the file will be); `tokenizer_now` where it can be read while the folder is being built."""
    model_bindings = bindings(cfg, tokenizer, separator_token)
    defaults = [] if gin_files or gin_params else [
        f"RecipeConfig.seq_len = {min(recipe.RecipeConfig().seq_len, cfg.max_seq_len)}"]
    configs = gin_config.parse_gin(list(gin_files), [*gin_params, *defaults, *model_bindings])
    vocab = load_tokenizer(tokenizer_now, separator_token).vocab_size
    if vocab > cfg.vocab_size:
        raise ConfigError(f"the folder's tokenizer has {vocab} token ids but the model's vocabulary holds "
                          f"{cfg.vocab_size}; the tokenizer does not belong to these weights")
    plan = recipe.make_plan(configs.model, configs.recipe)
    identity = Identity.of(configs, plan)
    rundir.write_run_files(folder, identity, plan, gin_config.operative_config_str())
    with open(os.path.join(folder, MODEL_GIN), "w") as f:
        f.write("# The imported model and its tokenizer: layer this file after a training run's gin files.\n")
        f.write("\n".join(model_bindings) + "\n")

    data = dataclasses.replace(configs.data, tokenizer=tokenizer_now)
    data_it = pipeline.make_train_iterator(data, plan.seq_len, plan.batch_seqs, seed=configs.train.seed)
    data_state = data_it.get_state()
    data_it.close()

    params = jax.tree.map(jnp.asarray, params)
    optimizer = optim.build_optimizer(plan, completep.multipliers(cfg, params))
    state = step_lib.init_state(cfg, optimizer, configs.monitor, jax.random.key(configs.train.seed))
    state = dataclasses.replace(state, params=params, opt_state=optimizer.init(params))
    checkpointer = Checkpointer(os.path.join(folder, rundir.CHECKPOINTS), identity, keep_last=1, keep_every=0,
                                use_async=False)
    checkpointer.save(0, state, data_state)
    checkpointer.close()
    return {"step": 0, "n_params": plan.n_params, "plan_steps": plan.steps, "tokenizer": tokenizer}
