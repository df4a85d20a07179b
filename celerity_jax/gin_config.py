"""The one place gin binds: it registers the config dataclasses and parses gin files and bindings.

A gin file binds fields by name (`ModelConfig.d_model = 640`); `include 'base.gin'` is looked up
beside the including file, then in the current directory. Library code never imports gin.
"""

import contextlib
import dataclasses
import logging
import os
import re
import tokenize
from collections.abc import Callable, Mapping, Sequence

import gin

from celerity_jax.collapse.config import MonitorConfig
from celerity_jax.configs import RunConfigs, TrainConfig
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError
from celerity_jax.model.config import ModelConfig
from celerity_jax.recipe import RecipeConfig

# (RunConfigs field, config class).
CONFIGS = (
    ("model", ModelConfig),
    ("recipe", RecipeConfig),
    ("data", DataConfig),
    ("train", TrainConfig),
    ("monitor", MonitorConfig),
)
_CONFIGURABLES = {key: gin.external_configurable(cls) for key, cls in CONFIGS}


def parse_gin(gin_files: Sequence[str], gin_params: Sequence[str] = (), *,
              base: Mapping[str, object] | None = None) -> RunConfigs:
    """Parses `gin_files` then the `gin_params` bindings into the run's configs.

    `base` optionally maps a key to a starting config (e.g. a model preset): fields bound in gin
    replace its values, the rest keep them. Unset fields otherwise take the class defaults.
    """
    gin.clear_config()
    for path in gin_files:
        if not os.path.isfile(path):
            raise ConfigError(f"gin file {path!r} does not exist; pass an existing file to --gin-file")
    # gin logs an error for every search directory that lacks an included file before it finds it;
    # a file that is found nowhere raises, so those logs are noise.
    previous_disable = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with _includes_beside(gin_files):
            for path in gin_files:
                _parse(gin.parse_config_file, path, in_file=True)
            # One binding at a time, so that an error names its binding.
            for binding in gin_params:
                _parse(gin.parse_config, binding, in_file=False)
        try:
            gin.finalize()
        except ValueError as e:  # a %macro that nothing binds
            raise _gin_error(None, str(e)) from None
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
        try:
            configs[key] = _CONFIGURABLES[key](**kwargs)
        except ConfigError as e:  # gin appends its own lines to the message, which names the field already
            raise ConfigError(str(e).partition("\n  In call to configurable")[0]) from None
    return RunConfigs(**configs)


def operative_config_str() -> str:
    """The bindings of every config built by the last `parse_gin`, defaults included."""
    return gin.operative_config_str()


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


def _parse(parse: Callable[[str], object], source: str, in_file: bool) -> None:
    """Runs `parse` on a gin file's path or on one binding; an error becomes a ConfigError naming the file
    and line, or the binding."""
    try:
        parse(source)
        return
    except SyntaxError as e:  # gin's parser, which puts the location in the exception
        message, location = e.msg, (e.filename, e.lineno, e.text or "")
    except (tokenize.TokenError, ValueError, OSError, ImportError) as e:  # gin appends any location to the message
        # The tokenizer ran to the end of the text inside brackets or quotes: its own message is unhelpful.
        message = "a bracket or a string quote is never closed" if isinstance(e, tokenize.TokenError) else str(e)
        location = m.groups() if (m := re.search(r'In file "(.*)", line (\d+)\n +(.*)', str(e))) else None
    if not in_file:
        where = f"--gin-param {source!r}"
    elif location:
        where = f"{location[0]}, line {location[1]}: {location[2].strip()!r}"
    else:
        where = source
    raise _gin_error(where, message) from None


def _gin_error(where: str | None, message: str) -> ConfigError:
    """One line naming the problem (the first line of gin's message) and where it is, then the fix."""
    classes = {cls.__name__: cls for _, cls in CONFIGS}
    problem = message.split("\n")[0].rstrip(".")
    fix = "write bindings as `Class.field = value` with Python literals (e.g. 20, 0.15, 'd2z', None)"
    m = re.search(r"Configurable '(\w+)' doesn't have a parameter named '(\w+)'", message)
    if m and m.group(1) in classes:
        fields = [f.name for f in dataclasses.fields(classes[m.group(1)])]
        fix = f"{m.group(1)} has no field {m.group(2)!r}; its fields are: {', '.join(fields)}"
    elif m := re.search(r"No configurable matching '([\w.]+)'", message):
        fix = f"{m.group(1)!r} is not a config class; bind one of: {', '.join(classes)}"
    elif "Unable to open file" in message:
        fix = "includes are looked up beside the including gin file, then in the current directory; check the path"
    elif m := re.search(r"Failed to parse token '(.*)'", message):  # gin's first line shows an ast object
        problem = f"{m.group(1)} is not a Python literal"
        fix = "put strings in quotes (e.g. DataConfig.source = 'text'); numbers, True, False and None go bare"
    elif "never closed" in message:
        fix = "close every (, [ and { and every quote the value opens, on the same binding"
    elif m := re.search(r"No bindings specified for '(\w+)/gin.macro'", message):
        problem = f"the macro %{m.group(1)} is used but never bound"
        fix = f"bind it (`{m.group(1)} = value`) or write the value in its place"
    return ConfigError(f"gin: {where + ': ' if where else ''}{problem}; fix: {fix}")
