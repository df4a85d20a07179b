"""`celerity sweep`: a hyperparameter sweep of one model, stopped early by predicting final losses.

spec.py: what a sweep is (SweepSpec, SweptValue) and its checks; runner.py: planning its runs, training them
(through `celerity_jax.run`) and predicting each setting's final loss; report.py: the summary (sweep.json),
rankings, decisions and sweep.md; pruner.py: the collapse pruner, the same early stopping for any Optuna study;
study.py: the settings as the trials of an Optuna study in a shared storage, taken by any number of workers (both
need the `sweep` extra). The command line is `celerity_jax/cli/sweep.py`.
"""
