"""Alignment: supervised fine-tuning on conversations and DPO on preference pairs (and, later, GRPO), built on gptlab.train."""
