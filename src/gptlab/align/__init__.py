"""Alignment: supervised fine-tuning on conversations (and, later, DPO and GRPO), built on gptlab.train."""
