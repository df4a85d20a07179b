"""The trainer.

`loop.train` runs a run: `setup` prepares everything before the first step (checks, `lock`, reference,
data, the compiled `step`, the run directory (celerity_jax/rundir), a checkpoint restore or an `init_from`
start, the writers), then the loop steps and records a `log_step` every few steps, with a `progress` line.
`config` holds TrainConfig and RunConfigs, `interrupts` the Ctrl-C handling, `logfile` where library output goes.
"""
