"""Preference optimisation: DPO (and its relatives) on preference pairs, the pairs read, checked, rendered and batched."""
