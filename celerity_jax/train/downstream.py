"""Downstream scores in the loop: lm-evaluation-harness tasks on the run's current parameters at evenly spaced t̂
(TrainConfig.downstream_tasks at t̂ = k/downstream_points, k = 1..downstream_points), so that every size of a
family is scored at the same t̂. Scores go where `celerity eval` puts them (`celerity_jax.evaluate.results`):
downstream/step_<S>.json and TensorBoard `downstream/<task>/<metric>`.
"""

import dataclasses
from collections.abc import Callable

from celerity_jax.configs import RunDefinition, TrainConfig
from celerity_jax.data.tokenizer import load_tokenizer


def downstream_steps(train_cfg: TrainConfig, total_steps: int) -> frozenset[int]:
    n = train_cfg.downstream_points if train_cfg.downstream_tasks else 0
    return frozenset(max(1, round(k * total_steps / n)) for k in range(1, n + 1))


@dataclasses.dataclass(frozen=True)
class Downstream:
    """The checked tasks of a run, and how to score its parameters on them."""
    tasks: object  # evaluate.tasks.CheckedTasks
    limit: int | None
    batch_size: int

    @classmethod
    def checked(cls, train_cfg: TrainConfig) -> "Downstream | None":
        """The run's downstream tasks with their data files checked (nothing is read from the model); None when
        the run scores none."""
        if not train_cfg.downstream_tasks:
            return None
        from celerity_jax.evaluate import tasks

        limit = train_cfg.downstream_limit or None
        checked = tasks.checked_tasks(",".join(train_cfg.downstream_tasks), train_cfg.downstream_data_dir or None,
                                      limit)
        return cls(checked, limit, train_cfg.downstream_batch_size)

    def score(self, model_cfg, data_cfg, params, mesh) -> dict[str, dict]:
        """harness.run_tasks's scores of `params` (as the run trains them, on its mesh)."""
        from celerity_jax.evaluate import harness

        tokenizer = load_tokenizer(data_cfg.tokenizer, data_cfg.separator_token)
        lm = harness.CelerityLM(model_cfg, params, mesh, tokenizer, self.batch_size)
        return harness.run_tasks(lm, self.tasks, self.limit)


def make_downstream(checked: Downstream | None, run: RunDefinition, mesh, workdir: str,
                    is_chief: bool) -> Callable | None:
    """(step, params) -> the TensorBoard scalars of the run's downstream scores at `step` (`checked`: the run's
    tasks, or None), also written to downstream/step_<S>.json on process 0 (other processes score too, and write
    nothing); None without tasks."""
    if checked is None:
        return None
    from celerity_jax.evaluate import results

    def score(step: int, params) -> dict[str, float]:
        scores = checked.score(run.configs.model, run.configs.data, params, mesh)
        if not is_chief:
            return {}
        content = results.record(workdir, step, run.plan.to_dict(), scores, write_tensorboard=False)
        return results.scalars(content, scores)

    return score
