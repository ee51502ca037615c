"""What the llama.cpp tests ask of llama.cpp, one function a call, each run by `tests.native.in_child` in a process
of its own: llama.cpp's CPU kernels are native code, and a crash there must fail one test, not the pytest worker.

Only llama_cpp and numpy are imported here, so a child starts in a fraction of a second.
"""

import numpy as np


def _load(path):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1, seed=0)


def encode(path, texts: list[str], ids: list[list[int]]) -> tuple[list[list[int]], list[bytes]]:
    """llama.cpp's ids for each text (no bos, special tokens as text), and its bytes for each list of ids."""
    llm = _load(path)
    try:
        return ([llm.tokenize(text.encode(), add_bos=False, special=False) for text in texts],
                [llm.detokenize(each) for each in ids])
    finally:
        llm.close()


def logits(path, ids: list[int]) -> np.ndarray:
    """The logits after each of `ids`, evaluated as one batch: (len(ids), vocab)."""
    llm = _load(path)
    try:
        llm.reset()
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def greedy(path, prompt: list[int], steps: int) -> list[int]:
    """`prompt` then `steps` greedy tokens, each decoded one at a time from llama.cpp's KV cache."""
    llm = _load(path)
    try:
        llm.reset()
        llm.eval(prompt)
        tokens = list(prompt)
        for _ in range(steps):
            tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([tokens[-1]])
        return tokens
    finally:
        llm.close()


def chat_prompt_ids(path, messages: list[dict]) -> list[int]:
    """The file's own chat template (its metadata) rendered for `messages`, then tokenized with special tokens."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = _load(path)
    try:
        eot = llm.detokenize([llm.token_eos()], special=True).decode()
        formatter = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token=eot, bos_token=eot)
        return llm.tokenize(formatter(messages=messages).prompt.encode(), add_bos=False, special=True)
    finally:
        llm.close()


def system_info() -> str:
    """llama.cpp's report of the instruction sets its CPU backend was compiled with (`AMX_INT8 = 1 | ...`)."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode()
