"""The trainer.

`loop.train` runs a run (a celerity_jax.configs.RunDefinition): `setup` prepares everything before the first step
(checks, `lock`, reference, data, the compiled `step` and its `memory` check, the run directory (celerity_jax/rundir),
a checkpoint restore or an `init_from` start, the writers), then the loop steps and records a `log_step` every few
steps, with a `progress` line and `downstream` scores. `interrupts` handles Ctrl-C, `logfile` says where library
output goes, and `supervisor` reports a lost process of a multi-host run.
"""
