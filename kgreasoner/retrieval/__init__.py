"""KG retrieval: search sessions with backtracking, the question-conditioned GAT ranker, text encoders.

Submodules import torch and transformers only where needed; this package imports nothing heavy.
"""
