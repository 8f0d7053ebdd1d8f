"""Knowledge-graph backends behind one interface (`KnowledgeGraph`)."""

from kgreasoner.kg.base import Edge, KGError, KnowledgeGraph, execute_path, follow

__all__ = ["Edge", "KGError", "KnowledgeGraph", "execute_path", "follow"]
