"""YAML recipes mapped onto documented dataclasses, with `--set key=value` overrides.

Every trainer has one config dataclass whose fields carry `metadata={"help": ...}`; this module
reads a YAML file into it, rejects unknown keys by name, and converts override strings to the
field's type.

Recipe paths (`--config configs/tiny-cpu/sft.yaml`, and the files a recipe names: templates, the
tiny model's YAML, a DeepSpeed JSON) are read as given when they exist from the current folder, else
a `configs/...` path from the package's own recipes (`PACKAGE_CONFIGS`, shipped as package data), so
an installed package runs its recipes from any folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import yaml

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
CONFIGS_PREFIX = "configs/"
PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"
"""The package's recipes: the checkout's `configs/` (linked), or their copy in an installed package."""


@overload
def resolve_recipe(path: str | Path) -> str: ...
@overload
def resolve_recipe(path: None) -> None: ...
def resolve_recipe(path: str | Path | None) -> str | None:
    """A recipe path as given when it exists from here, else a `configs/...` path from the package's own
    recipes; a path found in neither place raises FileNotFoundError naming both."""
    if path is None or Path(path).exists():
        return None if path is None else str(path)
    text = Path(path).as_posix()
    if not text.startswith(CONFIGS_PREFIX):
        raise FileNotFoundError(f"{path} not found (from {Path.cwd()})")
    candidate = PACKAGE_CONFIGS / text[len(CONFIGS_PREFIX) :]
    if not candidate.exists():
        raise FileNotFoundError(
            f"{path} not found here ({Path.cwd()}) or in the package's configs ({PACKAGE_CONFIGS})"
        )
    return str(candidate)


class ConfigError(ValueError):
    """A config file or override does not fit its dataclass; the message names file and key."""


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build `cls` from a YAML file (optional) and `key=value` overrides (dotted keys for nesting)."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        try:
            path = Path(resolve_recipe(path) or path)
        except FileNotFoundError as err:
            raise ConfigError(f"config file not found: {err}") from None
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of field names to values")
        data = loaded or {}
        source = str(path)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        _set_dotted(data, key.strip(), yaml.safe_load(raw))
    return from_dict(cls, data, source)


def from_dict(cls: type[T], data: dict[str, Any], source: str = "config") -> T:
    """Instantiate a (possibly nested) config dataclass, naming the offending key on error."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    # a config says where a misplaced key belongs, and what a key that changed form takes now, all in one
    # message, so a file in an old form is put right in one pass
    hint = getattr(cls, "misplaced_key", None)
    moved = [message for message in map(hint, unknown) if message] if hint else []
    old_forms = getattr(cls, "old_forms", None)
    moved += old_forms(data) if old_forms else []
    if moved:
        raise ConfigError(f"{source}: {'; '.join(moved)}")
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        kind = hints[name]
        factory = fields[name].default_factory
        if isinstance(value, dict) and factory is not dataclasses.MISSING and factory is not kind:
            # a default of its own (not a bare class's): the mapping changes the fields it names of it
            default = factory()
            if dataclasses.is_dataclass(default) and not isinstance(default, type):
                default = dataclasses.asdict(default)
            if isinstance(default, dict):
                value = merge(default, value)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = from_dict(kind, value, f"{source}: {name}")
        kwargs[name] = _coerce(value, kind, f"{source}: {name}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: {err}") from err


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` on top, mappings merged key by key at every depth (other values replaced)."""
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _coerce(value: Any, kind: Any, where: str) -> Any:
    """Loose YAML scalars into the annotated type (int -> float, str path -> str, ...)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if value is None:
            return None
        if len(args) == 1:
            return _coerce(value, args[0], where)
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        # YAML 1.1 reads `2e-3` (no dot) as a string.
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{where}: expected float, got {value!r}") from None
    if kind in (int, float, str, bool) and not isinstance(value, kind):
        raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}")
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        return origin(value)
    return value


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        data = data.setdefault(part, {})
    data[parts[-1]] = value


def count_or_all(value: int | str | None, name: str) -> int | None:
    """A count setting: `all` or null -> None (every item); a non-negative int stays; anything else names `name`."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, `all` or null, got {value!r}")
    return value


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--config FILE` and `--set key=value` flags every entry point takes."""
    parser.add_argument("--config", type=Path, help="YAML recipe")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field (repeatable; dotted keys for nested configs)",
    )


def config_command_main(
    prog: str,
    name: str,
    description: str,
    run_command: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """A module's own command line (`python -m ...`) over `--config`/`--set`: exit 1 with `NAME: error: ...`
    on a missing file or a bad setting, as the `kgreasoner` subcommands do."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_command(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 1


def describe(cls: type) -> str:
    """A field table (name, default, help) for `--help` texts and docs."""
    rows = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        )
        rows.append(f"  {f.name} = {default!r}: {f.metadata.get('help', '')}")
    return "\n".join(rows)
