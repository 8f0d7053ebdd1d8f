"""kgreasoner: teach a reasoning LLM to search a knowledge graph inside its own thinking."""

__version__ = "0.1.0"
