"""gptlab: build a GPT language model from scratch.

Stages, each a subpackage: tokenizer -> data -> model -> train -> eval.
Importing gptlab does nothing but define names (no device detection, no I/O).
"""

from gptlab.runtime.errors import GptlabError

__all__ = ["GptlabError", "__version__"]
__version__ = "0.1.0"
