"""An imported model as the start of a run: the run's definition and its train state at step 0, written as a run
directory by `celerity_jax.rundir.imported`.

Its configs are those of the run that will start from it (gin files and bindings; without any, the defaults with
the sequence length capped at the model's context) with the imported ModelConfig and tokenizer bound over them; its
train state at step 0 is the one such a run starts with (fresh optimizer state, empty monitor curve, data iterator
at its start) holding the imported parameters.
"""

import dataclasses

import jax
import jax.numpy as jnp

from celerity_jax import gin_config, optim, recipe
from celerity_jax.configs import RunConfigs, RunDefinition
from celerity_jax.data import pipeline
from celerity_jax.data.tokenizer import load_tokenizer
from celerity_jax.errors import ConfigError
from celerity_jax.model import completep, transformer
from celerity_jax.model.config import ModelConfig
from celerity_jax.rundir import imported
from celerity_jax.train import step as step_lib


def bindings(cfg: ModelConfig, tokenizer: str, separator_token: str) -> list[str]:
    """Gin bindings of the model and its tokenizer."""
    return ([f"ModelConfig.{f.name} = {getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg)]
            + [f"DataConfig.tokenizer = {tokenizer!r}", f"DataConfig.separator_token = {separator_token!r}"])


def run_configs(cfg: ModelConfig, model_bindings: list[str], gin_files=(), gin_params=()) -> RunConfigs:
    """The configs of the gin files and bindings, or without any the defaults with the sequence length capped at the
    model's context, with `model_bindings` over them."""
    defaults = [] if gin_files or gin_params else [
        f"RecipeConfig.seq_len = {min(recipe.RecipeConfig().seq_len, cfg.max_seq_len)}"]
    return gin_config.parse_gin(list(gin_files), [*gin_params, *defaults, *model_bindings])


def write(folder: str, cfg: ModelConfig, params: dict, *, tokenizer: str, separator_token: str, tokenizer_now: str,
          gin_files=(), gin_params=()) -> dict:
    """Writes the run directory into `folder`. `tokenizer` is the DataConfig.tokenizer the run records (where the file
    will be); `tokenizer_now` where it can be read while the folder is being built."""
    model_bindings = bindings(cfg, tokenizer, separator_token)
    configs = run_configs(cfg, model_bindings, gin_files, gin_params)
    vocab = load_tokenizer(tokenizer_now, separator_token).vocab_size
    if vocab > cfg.vocab_size:
        raise ConfigError(f"the folder's tokenizer has {vocab} token ids but the model's vocabulary holds "
                          f"{cfg.vocab_size}; the tokenizer does not belong to these weights")
    definition = RunDefinition.of(configs, gin_config.operative_config_str())
    plan = definition.plan

    data = dataclasses.replace(configs.data, tokenizer=tokenizer_now)
    data_it = pipeline.make_train_iterator(data, plan.seq_len, plan.batch_seqs, seed=configs.train.seed)
    data_state = data_it.get_state()
    data_it.close()

    params = jax.tree.map(jnp.asarray, params)
    optimizer = optim.build_optimizer(plan, completep.multipliers(cfg, transformer.declarations(cfg)))
    state = step_lib.init_state(cfg, optimizer, configs.monitor, jax.random.key(configs.train.seed))
    state = dataclasses.replace(state, params=params, opt_state=optimizer.init(params))
    imported.write(folder, definition, model_bindings, state, data_state)
    return {"step": 0, "n_params": plan.n_params, "plan_steps": plan.steps, "tokenizer": tokenizer}
