"""Dataclass configs: strict dotted overrides from the command line, and JSON snapshots.

    >>> apply_overrides(RunConfig(), ["--tokenizer.vocab_size", "8192"])   # doctest: +SKIP

An unknown key or a value of the wrong type is a GptlabError naming the key
and the accepted keys.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from gptlab.runtime.errors import GptlabError


def _parse_value(text: str, kind: Any, key: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        if text.lower() in ("none", "null"):
            return None
        return _parse_value(text, options[0], key)
    if origin is tuple:
        (item,) = typing.get_args(kind)[:1]
        return tuple(_parse_value(part, item, key) for part in text.split(",") if part)
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise GptlabError(f"--{key} expects true or false, got {text!r}")
    if kind in (int, float, str):
        try:
            return kind(text)
        except ValueError:
            raise GptlabError(f"--{key} expects {kind.__name__}, got {text!r}") from None
    raise GptlabError(f"--{key} cannot be set from the command line")


def _keys(config: Any, prefix: str = "") -> list[str]:
    keys = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            keys += _keys(value, f"{prefix}{field.name}.")
        else:
            keys.append(prefix + field.name)
    return keys


def _set(config: Any, path: list[str], text: str, key: str) -> Any:
    hints = typing.get_type_hints(type(config))
    names = {field.name for field in dataclasses.fields(config)}
    if path[0] not in names:
        raise GptlabError(f"unknown option --{key}; options: {', '.join('--' + k for k in _keys(config))}")
    current = getattr(config, path[0])
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise GptlabError(f"unknown option --{key}")
        return dataclasses.replace(config, **{path[0]: _set(current, path[1:], text, key)})
    if dataclasses.is_dataclass(current):
        raise GptlabError(f"--{key} is a group; set one of its fields, e.g. --{key}.{dataclasses.fields(current)[0].name}")
    return dataclasses.replace(config, **{path[0]: _parse_value(text, hints[path[0]], key)})


def apply_overrides(config: Any, overrides: list[str]) -> Any:
    """Apply ["--a.b", "1", "--c=x", ...] to a (nested, frozen) dataclass config; returns a new config."""
    i = 0
    while i < len(overrides):
        item = overrides[i]
        if not item.startswith("--"):
            raise GptlabError(f"unexpected argument {item!r}; options look like --key value")
        if "=" in item:
            key, text = item[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(overrides):
                raise GptlabError(f"{item} needs a value")
            key, text = item[2:], overrides[i + 1]
            i += 2
        config = _set(config, key.replace("-", "_").split("."), text, key)
    return config


def config_to_json(config: Any) -> str:
    return json.dumps(dataclasses.asdict(config), indent=2) + "\n"
