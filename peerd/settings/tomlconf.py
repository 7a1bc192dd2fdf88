"""Reading TOML tables into frozen settings with messages that name the file and key.

Each settings class reads its table with a `Table`, which remembers which keys
were used so that unknown keys (usually typos) are reported, not ignored.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from peerd.errors import ConfigError

T = TypeVar("T")
_MISSING = object()


def load_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None


def read_toml_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None
    return load_toml(text, str(path))


class Table:
    def __init__(self, data: dict[str, Any], source: str, name: str) -> None:
        self._data = data
        self._source = source
        self._name = name
        self._used: set[str] = set()

    def sub(self, key: str) -> Table:
        value = self.get(key, dict, {})
        return Table(value, self._source, f"{self._name}.{key}" if self._name else key)

    def get(
        self,
        key: str,
        kind: type[T] | tuple[type, ...],
        default: Any = _MISSING,
        check: Callable[[Any], bool] | None = None,
        expect: str = "",
    ) -> T:
        self._used.add(key)
        where = f"{self._source}: {self._name + '.' if self._name else ''}{key}"
        if key not in self._data:
            if default is _MISSING:
                raise ConfigError(f"{where} is required ({expect or _kind_name(kind)})")
            return default
        value = self._data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind is not bool:
            ok = False
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ConfigError(
                f"{where} = {value!r}: expected {expect or _kind_name(kind)}"
            )
        if check is not None and not check(value):
            raise ConfigError(f"{where} = {value!r}: expected {expect}")
        return value

    def given(self, key: str) -> bool:
        """Whether the file sets `key` (a default is not)."""
        return key in self._data

    def where(self, key: str) -> str:
        """How a message names `key`: the file, then the dotted key."""
        return f"{self._source}: {self._name + '.' if self._name else ''}{key}"

    def rest(self) -> dict[str, Any]:
        """Every key nobody has asked for yet, taken as they are (the caller
        checks them): e.g. an optimizer's own keyword arguments."""
        rest = {k: v for k, v in self._data.items() if k not in self._used}
        self._used.update(rest)
        return rest

    def finish(self) -> None:
        """Fail on keys nobody asked for (nested tables report their own)."""
        unknown = sorted(k for k in self._data if k not in self._used)
        if unknown:
            prefix = f"[{self._name}] " if self._name else ""
            raise ConfigError(f"{self._source}: {prefix}unknown key(s): {', '.join(unknown)}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false",
            dict: "a table", list: "a list"}.get(kind, kind.__name__)
