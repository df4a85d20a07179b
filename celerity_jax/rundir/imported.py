"""The run directory of an imported model (`celerity import-hf`, see hf/importer.py), written before any training:
the run files of the run that will start from it, model.gin, and a checkpoint at step 0 holding the imported
parameters. `celerity eval`, `celerity sample` and TrainConfig.init_from read it as any run directory."""

import os

from celerity_jax import rundir
from celerity_jax.rundir.checkpoint import Checkpointer

MODEL_GIN_HEADER = "# The imported model and its tokenizer: layer this file after a training run's gin files.\n"


def write(folder: str, definition, model_bindings: list[str], state, data_state: dict) -> None:
    """run.json, plan.json and config.gin of `definition` (a celerity_jax.configs.RunDefinition), model.gin holding
    `model_bindings`, and the checkpoint at step 0 of the train state `state` and the data iterator's `data_state`."""
    rundir.write_run_files(folder, definition.identity, definition.plan, definition.operative_gin)
    with open(os.path.join(folder, rundir.MODEL_GIN), "w") as f:
        f.write(MODEL_GIN_HEADER + "\n".join(model_bindings) + "\n")
    checkpointer = Checkpointer(os.path.join(folder, rundir.CHECKPOINTS), definition.identity, keep_last=1,
                                keep_every=0, use_async=False)
    checkpointer.save(0, state, data_state)
    checkpointer.close()
