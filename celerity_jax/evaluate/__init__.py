"""Using a trained model: load it from a run (`loader`), sample from it with a KV cache (`sampler`), score
token sequences (`scoring`), run lm-evaluation-harness tasks on it (`harness`, `tasks`, `builtin_task`), record
the scores (`results`) and draw a family's accuracy-against-FLOPs frontier (`frontier`).

`celerity sample`, `celerity eval` and `celerity frontier` are in `celerity_jax/cli/evaluate.py` and
`cli/frontier.py`.
"""
