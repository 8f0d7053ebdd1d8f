"""Knowledge-graph backends behind one interface (`KnowledgeGraph`); `open_kg(spec)` picks one."""

from kgreasoner.kg.base import KGError, KnowledgeGraph, execute_path, follow
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.open import SCHEMES, open_kg, parse_spec
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.sparql import SparqlKG

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
