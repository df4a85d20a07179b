"""The trainer: config, train state, jitted step, checkpoints, writers and the loop."""
