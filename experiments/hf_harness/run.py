"""Scores a run on the built-in task twice, with `celerity eval`'s harness model and with `lm_eval --model hf` on the
run's Hugging Face export (custom class, trust_remote_code), and writes both to results.json beside this file.

    python experiments/hf_harness/run.py --workdir runs/demo-full/tau/d64-l4 --limit 1000
"""

import argparse
import json
import os
import tempfile
import time

from celerity_jax.cli import main
from celerity_jax.evaluate import builtin_task, harness, loader, tasks


def score(lm, model_args, limit: int) -> dict:
    import lm_eval

    task_manager = tasks.task_manager(stock=False)
    task = task_manager.load([builtin_task.task_config(limit)])["tasks"][builtin_task.TASK_NAME]
    start = time.time()
    results = lm_eval.simple_evaluate(model=lm, model_args=model_args, tasks=[task], limit=limit, bootstrap_iters=0,
                                      task_manager=task_manager, log_samples=False)
    scores = {k: v for k, v in results["results"][builtin_task.TASK_NAME].items() if "stderr" not in k}
    return {**scores, "seconds": round(time.time() - start, 1)}


def run(workdir: str, limit: int) -> dict:
    model = loader.load_model(workdir)
    ours = score(harness.CelerityLM(model.cfg, model.params, model.mesh, model.tokenizer), None, limit)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hf")
        assert main(["export-hf", "--workdir", workdir, "--out", out]) == 0
        theirs = score("hf", f"pretrained={out},trust_remote_code=True,dtype=float32,device=cpu,batch_size=16", limit)
    same = all(ours[k] == theirs[k] for k in ours if k.endswith(",none"))
    return {"workdir": workdir, "step": model.step, "documents": limit, "celerity_eval": ours, "lm_eval_hf": theirs,
            "identical": same}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json"))
    args = parser.parse_args()
    result = run(args.workdir, args.limit)
    print(json.dumps(result, indent=1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
