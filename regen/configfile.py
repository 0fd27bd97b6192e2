"""The run config as its files give it: merged in order, the schema's defaults filled in, validated, and
every error one line naming the key (dotted path), the file it came from and, for a typo, the key meant.

Both ``regen check --configfile`` and the workflow (``rules/common.smk``) validate through
:func:`validate_config`; defaults are filled in place by the one default filler,
``regen.runconfig.filling_validator`` (as ``snakemake.utils.validate(..., set_default=True)`` fills
them), which also fills each section its owner types (``regen.runconfig.validated``). Code reads the
loaded config only through those typed sections (``regen.runconfig.config_section`` hands a section to
its owner).
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from regen.layout.names import CONFIG_SCHEMA
from regen.runconfig import config_schema, filling_validator, safe_load_yaml

#: the layer name of ``snakemake --config key=value`` overrides
COMMAND_LINE = "--config"
#: a value no file set (a schema default, or a key missing everywhere)
NO_FILE = "no config file sets it"
MAX_VALUE_CHARS = 60


class ConfigFileError(ValueError):
    """The config does not match the schema: one line per error (``lines``)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = tuple(lines)
        head = f"{len(self.lines)} config error(s) (the keys are described in {CONFIG_SCHEMA.resolve()}):"
        super().__init__("\n".join([head, *(f"  - {line}" for line in self.lines)]))


@dataclass(frozen=True, slots=True)
class ConfigLayer:
    """One source of config values, in merge order: a config file, or the command line's ``--config``."""

    name: str
    values: Mapping[str, Any]


def shown_path(path: str | os.PathLike[str]) -> str:
    """A file as the user would type it: relative to the working directory when under it."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(path)


def read_layers(
    files: Sequence[str | os.PathLike[str]], overrides: Mapping[str, Any] | None = None
) -> list[ConfigLayer]:
    """The config files (YAML or JSON) in merge order, then the ``--config`` overrides when given."""
    layers = []
    for name in files:
        with open(name) as fh:
            values = safe_load_yaml(fh) or {}
        if not isinstance(values, Mapping):
            raise ConfigFileError([f"(top level) ({shown_path(name)}): not a mapping of config keys"])
        layers.append(ConfigLayer(shown_path(name), values))
    if overrides:
        layers.append(ConfigLayer(COMMAND_LINE, dict(overrides)))
    return layers


def merged(layers: Sequence[ConfigLayer]) -> dict[str, Any]:
    """The layers merged as Snakemake merges config files: mappings key by key, anything else replaced."""
    out: dict[str, Any] = {}
    for layer in layers:
        _deep_update(out, copy.deepcopy(dict(layer.values)))
    return out


def _deep_update(base: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = value


def load_config(files: Sequence[str | os.PathLike[str]], *, whole: bool = True) -> dict[str, Any]:
    """The config files merged in order (later keys win), defaults filled in, validated. ``whole``
    False: a config that may lack the sections the schema requires (``regen tune --configfile`` plans
    from its ``server`` and ``generate`` sections alone); every section is still validated and filled."""
    layers = read_layers(files)
    schema = config_schema() if whole else {**config_schema(), "required": []}
    return validate_config(merged(layers), layers, schema)


# ------------------------------------------------------------------------------- validation --
def validate_config(
    config: dict[str, Any], layers: Sequence[ConfigLayer], schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``config`` with the schema's defaults filled in (in place); :class:`ConfigFileError` with one line
    per problem when it does not match the schema."""
    schema = config_schema() if schema is None else schema
    errors = sorted(
        filling_validator(schema).iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path]
    )
    lines: list[str] = []
    for error in errors:
        for line in error_lines(error, layers, schema):
            if line not in lines:
                lines.append(line)
    if lines:
        raise ConfigFileError(lines)
    return config


def error_lines(
    error: jsonschema.ValidationError, layers: Sequence[ConfigLayer], schema: Mapping[str, Any]
) -> list[str]:
    """One line per problem of one schema error: ``key (file): what is wrong[; did you mean ...]``."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        known = list((error.schema.get("properties") or {}).keys())
        unknown = [k for k in error.instance if k not in known]
        return [
            _line([*path, key], layers, "unknown key" + _suggestion(str(key), known, path, schema))
            for key in unknown
        ]
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [k for k in error.validator_value if k not in error.instance]
        return [_line([*path, key], layers, "missing: the schema requires it") for key in missing]
    return [_line(path, layers, _message(error))]


def _message(error: jsonschema.ValidationError) -> str:
    value = _short(error.instance)
    if error.validator == "enum":
        choices = list(error.validator_value)
        text = f"{value} is not one of {', '.join(_short(c) for c in choices)}"
        if isinstance(error.instance, str):
            close = difflib.get_close_matches(error.instance, [str(c) for c in choices], n=1)
            text += f"; did you mean {close[0]!r}?" if close else ""
        return text
    if error.validator == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        return f"{value} is not of type {wanted}"
    if error.validator in ("oneOf", "anyOf") and error.context:
        by_branch: dict[Any, str] = {}
        for sub in error.context:
            branch = sub.relative_schema_path[0] if sub.relative_schema_path else None
            by_branch.setdefault(branch, _message(sub))
        return ", or ".join(by_branch.values())
    return " ".join(str(error.message).split())[:200]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _suggestion(key: str, known: Sequence[str], path: Sequence[Any], schema: Mapping[str, Any]) -> str:
    """``; did you mean X?``: the same key elsewhere in the schema, else the closest key at that level."""
    elsewhere = [p for p in schema_keys(schema) if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"; did you mean {' or '.join(elsewhere)}? (it belongs there)"
    close = difflib.get_close_matches(key, list(known), n=1)
    if close:
        return f"; did you mean {close[0]}?"
    return f" (the keys here: {', '.join(known)})" if known else ""


def schema_keys(schema: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every key the schema names, as dotted paths."""
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        dotted = f"{prefix}{name}"
        out.append(dotted)
        if isinstance(sub, Mapping):
            out += schema_keys(sub, dotted + ".")
    return out


def _line(path: Sequence[Any], layers: Sequence[ConfigLayer], message: str) -> str:
    key = ".".join(str(p) for p in path) or "(top level)"
    return f"{key} ({source_of(path, layers)}): {message}"


def source_of(path: Sequence[Any], layers: Sequence[ConfigLayer]) -> str:
    """The last layer that sets ``path`` (the value the merge kept); for a key no layer sets, every file."""
    for layer in reversed(layers):
        if _has(layer.values, path):
            return layer.name
    files = [layer.name for layer in layers if layer.name != COMMAND_LINE]
    return ", ".join(files) if files and path else NO_FILE


def _has(node: Any, path: Sequence[Any]) -> bool:
    for part in path:
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if (isinstance(node, Mapping) and part in node) or in_list:
            node = node[part]
        else:
            return False
    return True
