"""Package exports imported on first use (PEP 562), so that importing a package runs none of its modules.

A package's `__init__` names each export's module in a table and hands it to `exports`; under
`TYPE_CHECKING` it imports the same names, so that type checkers see them with their types:

    if TYPE_CHECKING:
        from kgreasoner.kg.open import open_kg
    else:
        __getattr__ = exports(__name__, {"open_kg": "kgreasoner.kg.open"})
    __all__ = ["open_kg"]
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def exports(package: str, table: Mapping[str, str]) -> Callable[[str], object]:
    """The module-level `__getattr__` of `package`: `name` is imported from the module `table[name]` the first
    time it is asked for, then kept on the package; a name not in the table is an AttributeError."""

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
