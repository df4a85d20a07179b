import pytest

from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError


def test_defaults_are_the_builtin_corpus_with_bytes():
    cfg = DataConfig()
    assert (cfg.source, cfg.tokenizer, cfg.allow_repeat, cfg.on_bad_record, cfg.read_workers) == ("stdlib", "byte", True, "skip", 0)


def test_lists_become_tuples_so_the_config_stays_hashable():
    cfg = DataConfig(source="text", paths=["a.txt", "b.txt"], val_paths=["c.txt"])
    assert cfg.paths == ("a.txt", "b.txt") and cfg.val_paths == ("c.txt",)
    assert hash(cfg) == hash(DataConfig(source="text", paths=("a.txt", "b.txt"), val_paths=("c.txt",)))


@pytest.mark.parametrize("kwargs, field", [
    ({"source": "web"}, "DataConfig.source"),
    ({"paths": ("a.txt",)}, "DataConfig.paths"),
    ({"source": "text"}, "DataConfig.paths"),
    ({"source": "arrayrecord", "paths": ("a", "b")}, "exactly one folder"),
    ({"source": "arrayrecord", "paths": ("a",), "val_paths": ("b",)}, "no val_paths"),
    ({"val_fraction": 0.0}, "DataConfig.val_fraction"),
    ({"val_fraction": 1.0}, "DataConfig.val_fraction"),
    ({"on_bad_record": "ignore"}, "DataConfig.on_bad_record"),
    ({"source": "text", "paths": ("a",), "text_column": ""}, "DataConfig.text_column"),
    ({"read_workers": -1}, "DataConfig.read_workers=-1 must be 0"),
    ({"read_workers": 2}, "read_workers=2 needs DataConfig.source='arrayrecord'"),
])
def test_bad_fields_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        DataConfig(**kwargs)
