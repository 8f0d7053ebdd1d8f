"""Knowledge-graph backends behind one interface (`KnowledgeGraph`); `open_kg(spec)` picks one.

The exports are imported on first use (`kgreasoner.lazy`): importing the package loads no store."""

from typing import TYPE_CHECKING

from kgreasoner.lazy import exports

if TYPE_CHECKING:
    from kgreasoner.kg.base import KGError, KnowledgeGraph, execute_path, follow
    from kgreasoner.kg.memory import MemoryKG
    from kgreasoner.kg.open import SCHEMES, open_kg, parse_spec
    from kgreasoner.kg.oxigraph_store import OxigraphKG
    from kgreasoner.kg.sparql import SparqlKG
else:
    __getattr__ = exports(
        __name__,
        {
            "KGError": "kgreasoner.kg.base",
            "KnowledgeGraph": "kgreasoner.kg.base",
            "MemoryKG": "kgreasoner.kg.memory",
            "OxigraphKG": "kgreasoner.kg.oxigraph_store",
            "SCHEMES": "kgreasoner.kg.open",
            "SparqlKG": "kgreasoner.kg.sparql",
            "execute_path": "kgreasoner.kg.base",
            "follow": "kgreasoner.kg.base",
            "open_kg": "kgreasoner.kg.open",
            "parse_spec": "kgreasoner.kg.open",
        },
    )

__all__ = [
    "KGError",
    "KnowledgeGraph",
    "MemoryKG",
    "OxigraphKG",
    "SCHEMES",
    "SparqlKG",
    "execute_path",
    "follow",
    "open_kg",
    "parse_spec",
]
