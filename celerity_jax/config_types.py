"""Checks the fields of a config dataclass against their declared types, where the config is built.

Gin and JSON hand over values as written: a string where a number belongs, a float for an int, a string
for a tuple of strings. Each config's `__post_init__` calls `check_field_types` first, so such a value
stops the run at once with one line naming the field, instead of failing (or being misread) later.
"""

import dataclasses
import types
import typing

from celerity_jax.errors import ConfigError

_NAMES = {bool: "True or False", int: "an int", float: "a number", str: "a string", type(None): "None"}
_PLURALS = {bool: "bools", int: "ints", float: "numbers", str: "strings"}


def check_field_types(config) -> None:
    """Raises ConfigError unless every field of the frozen dataclass `config` holds its declared type.

    bool is exactly bool, int is not bool, float takes ints too; a tuple field takes a list (gin and JSON
    give lists), which is stored as a tuple.
    """
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, annotation = getattr(config, field.name), hints[field.name]
        if not _matches(value, annotation):
            raise ConfigError(f"{type(config).__name__}.{field.name}={value!r} must be {_describe(annotation)}"
                              f"{_example(value, annotation, field.default)}")
        if isinstance(value, list):
            object.__setattr__(config, field.name, tuple(value))


def _matches(value, annotation) -> bool:
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation in (str, type(None)):
        return isinstance(value, annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        return any(_matches(value, arg) for arg in args)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if args[-1] is Ellipsis:
            return all(_matches(item, args[0]) for item in value)
        return len(value) == len(args) and all(map(_matches, value, args))
    raise TypeError(f"config_types has no check for the annotation {annotation!r}; add one")


def _describe(annotation) -> str:
    """'an int', 'a number or None', 'a tuple of 3 ints', ..."""
    if annotation in _NAMES:
        return _NAMES[annotation]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is not tuple:  # a union
        return " or ".join(map(_describe, args))
    if args[-1] is Ellipsis:
        return f"a tuple of {_PLURALS[args[0]]}"
    if len(set(args)) == 1:
        return f"a tuple of {len(args)} {_PLURALS[args[0]]}"
    return f"a tuple ({', '.join(map(_describe, args))})"


def _example(value, annotation, default) -> str:
    """The fix: the value wrapped in a tuple where it should have been one, else the field's default where
    that makes a telling example."""
    if typing.get_origin(annotation) is tuple and _matches((value,), annotation):
        return f"; give a tuple, e.g. ({value!r},)"
    if default in (None, "", (), dataclasses.MISSING) or isinstance(default, bool):
        return ""
    return f", e.g. {default!r}"
