"""lm-evaluation-harness in process: a model of the harness's interface backed by the jitted forward and the KV-cache
sampler, and the run of a list of tasks on it.

- `loglikelihood`: the continuation's log-probability and whether it is the greedy one (`scoring.Scorer`);
- `loglikelihood_rolling`: a document's log-probability, in the harness's windows of the model's context;
- `generate_until`: greedy (or sampled, where the task asks) continuations up to the task's stop strings.
The tokenizer's end-of-text token conditions an empty context, as it separates documents in training.
"""

import dataclasses
import functools
import logging

from celerity_jax.evaluate import offline  # noqa: F401  (before the harness)

from lm_eval import utils as lm_utils  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402

from celerity_jax.errors import ConfigError  # noqa: E402
from celerity_jax.evaluate import sampler, scoring, tasks  # noqa: E402
from celerity_jax.model import transformer  # noqa: E402

DEFAULT_MAX_GEN_TOKS = 256
_PROBE = "Hello world, 42 times."  # text every tokenizer that can decode gives back as it was


class CelerityLM(TemplateLM):
    """The harness's model interface for one of our models: its config, parameters on a mesh (as a run trains them,
    scanned or not) and tokenizer."""

    def __init__(self, cfg, params, mesh, tokenizer, batch_size: int = 16):
        super().__init__()
        # Nothing is differentiated, and sequence lengths are bucketed: the loss chunking picks its own.
        self.cfg = dataclasses.replace(cfg, remat="none", logits_chunk_len="auto")
        self.params, self.mesh, self.tokenizer_ = params, mesh, tokenizer
        self.scorer = scoring.Scorer(self.cfg, params, mesh, batch_size)
        self.batch_size = batch_size
        self.truncated = 0  # requests whose context was cut to fit the model

    @functools.cached_property
    def decoder(self) -> sampler.Decoder:
        return sampler.Decoder(*transformer.unstack_layers(self.cfg, self.params), self.mesh)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer_.separator_id

    @property
    def max_length(self) -> int:
        return self.cfg.max_seq_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return [int(t) for t in self.tokenizer_.encode_batch([string])[0]]

    def tok_decode(self, tokens) -> str:
        return self.tokenizer_.decode(tokens)

    def loglikelihood(self, requests, disable_tqdm: bool = True) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)  # its bar times tokenizing, not scoring

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        scores = self.scorer.score([(context, continuation) for _, context, continuation in requests])
        self.truncated += sum(s.truncated for s in scores)
        return [(s.logprob, s.greedy) for s in scores]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, (text,) in enumerate(r.args for r in requests):
            for window in lm_utils.get_rolling_token_windows(token_list=self.tok_encode(text),
                                                             prefix_token=self.prefix_token_id,
                                                             max_seq_len=self.max_length, context_len=1):
                windows.append(lm_utils.make_disjoint_window(window))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, score in zip(owner, self.scorer.score(windows)):
            totals[i] += score.logprob
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if requests:
            check_can_decode(self.tokenizer_)
        out = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(repr(sorted(r.args[1].items())), []).append(i)
        for members in groups.values():
            kwargs = dict(requests[members[0]].args[1])
            stop = kwargs.pop("until", None) or [self.tok_decode([self.eot_token_id])]
            max_new = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            temperature = float(kwargs.pop("temperature", 0.0)) if kwargs.pop("do_sample", False) else 0.0
            budget = max(1, self.max_length - max_new)
            prompts = []
            for i in members:
                ids = self.tok_encode(requests[i].args[0]) or [self.prefix_token_id]
                self.truncated += len(ids) > budget
                prompts.append(ids[-budget:])
            generations = sampler.generate(self.decoder, self.tokenizer_, prompts, max_new_tokens=max_new,
                                           temperature=temperature, top_p=float(kwargs.pop("top_p", 1.0)),
                                           stop=tuple([stop] if isinstance(stop, str) else stop),
                                           batch_size=self.batch_size)
            for i, g in zip(members, generations):
                out[i] = g.text
        return out


def check_can_decode(tokenizer) -> None:
    """Refuses generation with a tokenizer whose decode does not give back what it encoded."""
    if tokenizer.decode(tokenizer.encode_batch([_PROBE])[0]) != _PROBE:
        raise ConfigError(f"the tokenizer {tokenizer.name} cannot decode what it encodes (a round trip of a short "
                          "text differs), so generated text would be wrong; use log-likelihood tasks only, or a "
                          "tokenizer.json with a decoder")


def run_tasks(lm: CelerityLM, checked: tasks.CheckedTasks, limit: int | None) -> dict:
    """The harness's results for the checked tasks: {task: {"metric", "value", "stderr", "docs", "shots",
    "truncated"}} (truncated: requests cut to fit the model's context)."""
    import lm_eval

    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)
    built = checked.manager.load(checked.configs)["tasks"]
    out = {}
    for s in checked.specs:  # one at a time, to count each task's truncated requests
        lm.truncated = 0
        results = lm_eval.simple_evaluate(model=lm, tasks=[built[s.name]], limit=limit, log_samples=False,
                                          task_manager=checked.manager, bootstrap_iters=1000)
        scores = results["results"][s.name]
        out[s.name] = {"metric": s.metric, "value": float(scores[f"{s.metric},none"]),
                       "stderr": _number(scores.get(f"{s.metric}_stderr,none")),
                       "docs": int(results["n-samples"][s.name]["effective"]), "shots": s.shots,
                       "truncated": lm.truncated}
    return out


def _number(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None  # the harness writes "N/A" where it has no stderr


def score_checkpoint(workdir: str, step: int | None, task_text: str, data_dir: str | None, limit: int | None,
                     batch_size: int = 16) -> tuple[dict, dict]:
    """The run's checkpoint at `step` (default: the newest) scored on the tasks `task_text` names, every data file
    checked before the model is loaded: (the step's results file with the scores added, the scores), nothing
    written (evaluate/results.py writes them)."""
    from celerity_jax.evaluate import loader, results

    checked = tasks.checked_tasks(task_text, data_dir, limit)
    model = loader.load_model(workdir, step)
    lm = CelerityLM(model.cfg, model.params, model.mesh, model.tokenizer, batch_size)
    scores = run_tasks(lm, checked, limit)
    return results.merged(workdir, model.step, model.plan, scores), scores


def evaluate_checkpoint(workdir: str, step: int | None, task_text: str, data_dir: str | None, limit: int | None,
                        batch_size: int = 16) -> dict:
    """`score_checkpoint`, its scores written to the run directory; returns the step's results file."""
    from celerity_jax.evaluate import results

    content, scores = score_checkpoint(workdir, step, task_text, data_dir, limit, batch_size)
    results.write(workdir, content, scores)
    return content
