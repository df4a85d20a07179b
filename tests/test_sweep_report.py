from celerity_jax.sweep import report


def test_kendall_tau_and_decide():
    assert report.kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert report.kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0
    preds = {"a": {"pred": 2.0, "err": 0.1}, "b": {"pred": 1.0, "err": 0.1}, "c": {"pred": 3.0, "err": 0.1}}
    assert report.decide(preds, 2) == ["b", "a"]
    assert report.decide({**preds, "d": None}, 1) is None
