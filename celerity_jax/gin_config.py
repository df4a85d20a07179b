"""The one place gin binds: it registers the config dataclasses and parses gin files and bindings.

A gin file binds fields by name (`ModelConfig.d_model = 640`); `include 'base.gin'` is looked up
beside the including file, then in the current directory. Library code never imports gin.
"""

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence

import gin

from celerity_jax.collapse.monitor import MonitorConfig
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig
from celerity_jax.recipe import RecipeConfig
from celerity_jax.train.config import TrainConfig

# (key in parse_gin's result, config class).
CONFIGS = (
    ("model", ModelConfig),
    ("recipe", RecipeConfig),
    ("data", DataConfig),
    ("train", TrainConfig),
    ("monitor", MonitorConfig),
)
_CONFIGURABLES = {key: gin.external_configurable(cls) for key, cls in CONFIGS}


def parse_gin(gin_files: Sequence[str], gin_params: Sequence[str] = (), *,
              base: Mapping[str, object] | None = None) -> dict[str, object]:
    """Parses `gin_files` then the `gin_params` bindings; returns {"model": ModelConfig, ...}.

    `base` optionally maps a key to a starting config (e.g. a model preset): fields bound in gin
    replace its values, the rest keep them. Unset fields otherwise take the class defaults.
    """
    gin.clear_config()
    for path in gin_files:
        if not os.path.isfile(path):
            raise ConfigError(f"gin file {path!r} does not exist; pass an existing file to --gin_file")
    # gin logs an error for every search directory that lacks an included file before it finds it;
    # a file that is found nowhere raises, so those logs are noise.
    previous_disable = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with _includes_beside(gin_files):
            gin.parse_config_files_and_bindings(list(gin_files), list(gin_params))
    except SyntaxError as e:  # its message lacks the offending binding
        raise ConfigError(f"gin: {e.filename or '--gin_param'}, line {e.lineno}: {e.text!r}: "
                          f"{e.msg}\nFix: {_fix_for(e.msg)}") from None
    except (ValueError, OSError) as e:
        raise ConfigError(f"gin: {e}\nFix: {_fix_for(str(e))}") from None
    finally:
        logging.disable(previous_disable)
    configs = {}
    for key, cls in CONFIGS:
        start = (base or {}).get(key)
        kwargs = {}
        if start is not None:
            bound = gin.get_bindings(cls)
            kwargs = {f.name: getattr(start, f.name) for f in dataclasses.fields(start)
                      if f.name not in bound}
        configs[key] = _CONFIGURABLES[key](**kwargs)
    return configs


def operative_config_str() -> str:
    """The bindings of every config built by the last `parse_gin`, defaults included."""
    return gin.operative_config_str()


def train_from_gin(gin_files: Sequence[str], gin_params: Sequence[str], workdir: str, **train_kwargs) -> dict:
    """Parses the run's gin files and bindings and trains (or resumes) it in `workdir`, saving its
    operative config there; `train_kwargs` go to `celerity_jax.train.loop.train`."""
    from celerity_jax.train.loop import RunConfigs, train

    configs = RunConfigs(**parse_gin(gin_files, gin_params))
    return train(configs, workdir, operative_config=operative_config_str(), **train_kwargs)


@contextlib.contextmanager
def _includes_beside(gin_files: Sequence[str]):
    """Lets includes resolve beside the given files during one parse.

    gin has no public way to remove a search path, so its list is restored afterwards: otherwise an
    include could resolve against the directory of an earlier, unrelated parse.
    """
    prefixes = gin.config._LOCATION_PREFIXES
    saved = list(prefixes)
    prefixes.extend(dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in gin_files))
    try:
        yield
    finally:
        prefixes[:] = saved


def _fix_for(message: str) -> str:
    classes = {cls.__name__: cls for _, cls in CONFIGS}
    if m := re.search(r"Configurable '(\w+)' doesn't have a parameter named '(\w+)'", message):
        fields = [f.name for f in dataclasses.fields(classes[m.group(1)])]
        return f"{m.group(1)} has no field {m.group(2)!r}; its fields are: {', '.join(fields)}"
    if m := re.search(r"No configurable matching '([\w.]+)'", message):
        return f"{m.group(1)!r} is not a config class; bind one of: {', '.join(classes)}"
    if "Unable to open file" in message:
        return ("includes are looked up beside the including gin file, then in the current "
                "directory; check the path")
    return "write bindings as `Class.field = value` with Python literals (e.g. 20, 0.15, 'd2z', None)"
