"""Inference: sampling and the batched generation engine. Ids in, ids out.

The engine knows nothing about text: the CLI (gptlab.cli.sample) encodes the
prompt and decodes what comes back. Not here: the model and its KV cache
(gptlab.model).
"""

from gptlab.infer.engine import Engine, EngineConfig, Finished, Request
from gptlab.infer.generate import SamplingConfig, generate, sample_next, stream

__all__ = ["Engine", "EngineConfig", "Finished", "Request", "SamplingConfig", "generate", "sample_next", "stream"]
