"""Model: the decoder-only Transformer (GPT-2 and Llama-style), its config and presets, the KV cache.

Single device: no optimizer, no torch.distributed, no tokenizer.
"""

from gptlab.model.cache import KVCache
from gptlab.model.config import PRESETS, ModelConfig, preset
from gptlab.model.gpt import GPT

__all__ = ["GPT", "KVCache", "ModelConfig", "PRESETS", "preset"]
