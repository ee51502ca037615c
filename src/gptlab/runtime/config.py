"""Dataclass configs: strict dotted overrides from the command line, help for every field, JSON snapshots.

    >>> apply_overrides(RunConfig(), ["--tokenizer.vocab-size", "8192", "--train.max_steps=600"])  # doctest: +SKIP

Flags are hyphenated (`--model.n-layer`); underscores are accepted as aliases.
Overrides are applied to a plain copy of the config and the dataclasses are
built once at the end, so every check runs on the final values and the order
of the flags never matters. An unknown key suggests the full dotted name; a
value of the wrong type names the key and the type it expects.

A field's help is the comment at the end of its line in the dataclass source,
so the meaning and the default sit beside the field, and `--help` lists them.
Not here: the configs themselves (each component owns its own).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import io
import json
import re
import tokenize
import types
import typing
from typing import Any

from gptlab.runtime.errors import GptlabError


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    key: str  # dotted, with underscores: "model.n_layer"
    kind: Any  # the annotation, resolved
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


def flag(key: str) -> str:
    """"model.n_layer" -> "--model.n-layer": how the command line spells a key."""
    return "--" + key.replace("_", "-")


# ---------------------------------------------------------------- reading the fields


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """{field: the comment at the end of its line} from the class source, and its dataclass bases' for the
    fields it inherits ({} when the source is not at hand)."""
    comments: dict[str, str] = {}
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            comments.update(field_comments(base))
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return comments
    names = {field.name for field in dataclasses.fields(cls)}
    line_name: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
            line_name.setdefault(token.start[0], token.string)
        elif token.type == tokenize.COMMENT and token.start[0] in line_name:
            comments[line_name[token.start[0]]] = token.string.lstrip("#").strip()
    return comments


def config_fields(config: Any, prefix: str = "") -> list[FieldInfo]:
    """Every leaf field of a (nested) dataclass config, with its current value as the default."""
    hints = typing.get_type_hints(type(config))
    comments = field_comments(type(config))
    found = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            found += config_fields(value, f"{prefix}{field.name}.")
        else:
            found.append(FieldInfo(prefix + field.name, hints[field.name], value, comments.get(field.name, "")))
    return found


def _type_name(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return "|".join(_type_name(k) for k in typing.get_args(kind) if k is not type(None)) + "|none"
    if origin is tuple:
        return f"{_type_name(typing.get_args(kind)[0])},..."
    return getattr(kind, "__name__", str(kind)).upper()


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else repr(value) if value == "" else str(value)


def describe_fields(config: Any, *, skip: typing.Iterable[str] = ()) -> str:
    """One line per field: flag, type, default and meaning (for `--help`); `skip` leaves out keys and groups."""
    skipped = set(skip)
    rows = [(f"{info.flag} {_type_name(info.kind)}", _show(info.default), info.help)
            for info in config_fields(config)
            if info.key not in skipped and not any(info.key.startswith(group + ".") for group in skipped)]
    width = max(len(row[0]) for row in rows)
    default_width = min(max(len(row[1]) for row in rows), 14)
    return "\n".join(f"  {name:<{width}}  {default:<{default_width}}  {meaning}".rstrip() for name, default, meaning in rows)


# ---------------------------------------------------------------- parsing values


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
        raise GptlabError(f"{flag(key)} expects true or false, got {text!r}")
    if kind in (int, float, str):
        try:
            return kind(text)
        except ValueError:
            raise GptlabError(f"{flag(key)} expects {'a number' if kind is float else 'an integer' if kind is int else 'text'}, "
                              f"got {text!r}") from None
    raise GptlabError(f"{flag(key)} cannot be set from the command line")


def _suggest(key: str, keys: list[str]) -> str:
    """The likely full dotted name for a mistyped or shortened key."""
    leaf = [k for k in keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
    close = leaf or difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return f"; did you mean {' or '.join(flag(k) for k in close)}?" if close else ""


def parse_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    """["--a.b", "1", "--c-d=x"] -> [("a.b", "1"), ("c_d", "x")], keys with underscores."""
    pairs, i = [], 0
    while i < len(overrides):
        item = overrides[i]
        if not item.startswith("--") or item == "--":
            raise GptlabError(f"unexpected argument {item!r}; options look like --key value")
        if "=" in item:
            key, text = item[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(overrides) or (overrides[i + 1].startswith("--") and overrides[i + 1] != "--"):
                raise GptlabError(f"{item} needs a value")
            key, text = item[2:], overrides[i + 1]
            i += 2
        pairs.append((key.replace("-", "_"), text))
    return pairs


# ---------------------------------------------------------------- applying them


def _set(values: dict, key: str, value: Any) -> None:
    *path, name = key.split(".")
    for part in path:
        values = values[part]
    values[name] = value


def apply_overrides(config: Any, overrides: list[str], *, fixed: dict[str, str] | None = None,
                    defaults: dict[str, Any] | None = None) -> Any:
    """Apply ["--a.b", "1", "--c=x", ...] to a (nested, frozen) dataclass config; returns a new config.

    `fixed` maps keys a command sets itself to the reason, so setting them is an error, not ignored.
    `defaults` ({"model.vocab_size": 512}) replace the config's values before the overrides, which win.
    Every value is set first and the config is built (and checked) once, from the final values.
    """
    fields = {info.key: info for info in config_fields(config)}
    groups = {key.rsplit(".", 1)[0] for key in fields if "." in key}
    values = dataclasses.asdict(config)
    for key, value in (defaults or {}).items():
        _set(values, key, value)
    for key, text in parse_overrides(overrides):
        if key in (fixed or {}):
            raise GptlabError(f"{flag(key)} cannot be set here: {fixed[key]}")
        if key in groups:
            first = next(k for k in fields if k.startswith(key + "."))
            raise GptlabError(f"{flag(key)} is a group; set one of its fields, e.g. {flag(first)}")
        if key not in fields:
            settable = [k for k in fields if k not in (fixed or {})]
            raise GptlabError(f"unknown option {flag(key)}{_suggest(key, settable)} (--help lists every option)")
        _set(values, key, _parse_value(text, fields[key].kind, key))
    return build_config(type(config), values)


def build_config(cls: type, data: dict, *, source: str = "") -> Any:
    """A (nested) dataclass from a dict such as `dataclasses.asdict` or a JSON snapshot gives; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise GptlabError(f"{source or cls.__name__}: unknown fields {', '.join(unknown)}")
    kwargs = {}
    for name, value in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            try:
                value = build_config(kind, value, source=f"{source or cls.__name__}.{name}")
            except GptlabError as error:  # its flags as this config's command line spells them: --train.seq-len
                raise GptlabError(prefix_flags(str(error), kind, name)) from None
        elif typing.get_origin(kind) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as error:
        raise GptlabError(f"{source or cls.__name__}: {error}") from None


FLAG = re.compile(r"--([a-z][a-z0-9-]*)((?:\.[a-z0-9-]+)*)")


def prefix_flags(message: str, kind: type, name: str) -> str:
    """"--seq-len 256 ..." -> "--train.seq-len 256 ...": a nested config's error names the flags the user types,
    which carry the field's name in front (only flags whose first part is a field of `kind` are changed)."""
    fields = {field.name for field in dataclasses.fields(kind)}

    def prefixed(match: re.Match) -> str:
        first = match.group(1).replace("-", "_")
        return f"--{name.replace('_', '-')}.{match.group(1)}{match.group(2)}" if first in fields else match.group(0)

    return FLAG.sub(prefixed, message)


def config_to_json(config: Any) -> str:
    return json.dumps(dataclasses.asdict(config), indent=2) + "\n"


def config_changes(old: dict, new: dict, prefix: str = "", defaults: dict | None = None) -> list[str]:
    """["train.max_steps 600 -> 5", ...]: how two config snapshots (as dicts) differ, key by key.

    A key the old snapshot lacks is a field added to gptlab since it was saved: the old run ran with that
    field's default (see `field_defaults`), so it is compared as that default: the new snapshot at the
    default is no change, and away from it the change reads "default -> value", not "None -> value".
    A whole config group added since is compared field by field against its defaults the same way.
    """
    changes, defaults = [], defaults or {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, defaults.get(key)), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            nested = defaults.get(key) if isinstance(defaults.get(key), dict) else None
            changes += config_changes(a, b, f"{prefix}{key}.", nested)
        elif not _same(a, b):
            changes.append(f"{prefix}{key} {_show(a)} -> {_show(b)}")
    return changes


def _same(a, b) -> bool:
    return a == b or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))


def field_defaults(cls: type) -> dict:
    """Each field's default, nested configs as dicts (what `config_changes` assumes for a field an old run lacks)."""
    defaults = {}
    for item in dataclasses.fields(cls):
        if item.default is not dataclasses.MISSING:
            value = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            continue
        defaults[item.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return defaults
