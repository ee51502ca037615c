"""Evaluation: loss and bits per byte on held-out shards (more tasks come with the evaluation stage)."""
