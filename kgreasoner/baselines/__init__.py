"""Pipeline baselines over the same LLM client and KG layer: io/cot, ToG, SoG, PaRoG, the oracle.

Each module defines a `Method` (see `kgreasoner.baselines.base`); the registry that names them
for `kgreasoner eval` is `kgreasoner.evaluation.methods`.
"""
