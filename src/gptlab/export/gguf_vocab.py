"""A gptlab tokenizer inside a GGUF file, so llama.cpp encodes text to gptlab's ids; and the Ollama Modelfile beside it.

Byte-level BPE (gptlab.tokenizer.Tokenizer) -> tokenizer.ggml.model "gpt2": tokens in GPT-2's printable byte alphabet
(as Hugging Face's vocab.json), merges "a b" in rank order, and tokenizer.ggml.pre naming the split regex llama.cpp
runs: gptlab's gpt2 pattern -> "gpt-2", gpt4 (cl100k) -> "llama-bpe" (Llama 3's regex, which splits text as cl100k),
o200k -> "gpt-4o". Another regex, no split, or a Unicode normaliser would give other ids in llama.cpp: refused.
SentencePiece BPE (SentencePieceTokenizer) -> model "llama": pieces, scores and types (the proto's numbers are
GGUF's); llama.cpp applies no normalisation rules beyond the dummy prefix and "▁" for spaces, so a model with a
charsmap, extra-whitespace removal or whitespace-as-suffix is refused.
Special tokens are CONTROL tokens; ids the model has beyond the tokenizer's are UNUSED "[PADn]" tokens.
Ids: bos and eos are the end-of-text token (GPT-2's convention, as the Hugging Face export; a SentencePiece model's
bos is <s>); a chat model (its tokenizer holds the chat tokens) adds eot = <|end|>, which llama.cpp stops on, and
gptlab.chat's Jinja template. Nothing is added around the ids (add_bos_token false), as gptlab encodes.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptlab.chat import CHAT_TOKENS, END, ROLE_TOKENS, chat_template
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.tokenizer import GPT2_PATTERN, GPT4_PATTERN, O200K_PATTERN, SentencePieceTokenizer
from gptlab.tokenizer.formats import byte_to_unicode
from gptlab.tokenizer.patterns import pattern_name

PRE_TOKENIZERS = {GPT2_PATTERN: "gpt-2", GPT4_PATTERN: "llama-bpe", O200K_PATTERN: "gpt-4o"}
NORMAL, UNKNOWN, CONTROL, UNUSED = 1, 2, 3, 5  # GGUF's token types (the same numbers as SentencePiece's)


def is_chat(tokenizer) -> bool:
    return all(token in tokenizer.special_tokens for token in CHAT_TOKENS)


def check_gguf_tokenizer(tokenizer, n_vocab: int) -> None:
    """Refuse, before writing, a tokenizer llama.cpp would encode to other ids, or one with more ids than the model."""
    if tokenizer.vocab_size > n_vocab:
        raise GptlabError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only {n_vocab}; pass the model's own "
                          f"tokenizer (--tokenizer)")
    if isinstance(tokenizer, SentencePieceTokenizer):
        spec, model = tokenizer.model.normalizer, tokenizer.model
        bad = [f"normalizer {spec.name}"] * bool(spec.charsmap) + ["remove_extra_whitespaces"] * spec.remove_extra_whitespaces
        bad += ["treat_whitespace_as_suffix"] * model.treat_whitespace_as_suffix + ["a denormalizer"] * (model.denormalizer is not None)
        bad += ["escape_whitespaces false"] * (not spec.escape_whitespaces)
        if bad:
            raise GptlabError(f"cannot export this SentencePiece tokenizer as GGUF: {', '.join(bad)} has no llama.cpp equivalent "
                              f"(llama.cpp adds the dummy prefix and nothing else); train one with --normalizer identity")
        return
    if tokenizer.normalizer:
        raise GptlabError(f"cannot export this tokenizer as GGUF: its {tokenizer.normalizer} normaliser has no llama.cpp equivalent")
    if tokenizer.pattern not in PRE_TOKENIZERS:
        raise GptlabError(f"cannot export this tokenizer as GGUF: its split pattern ({pattern_name(tokenizer.pattern)}) has no "
                          f"llama.cpp pre-tokenizer; llama.cpp splits as gptlab's gpt2, gpt4 and o200k patterns "
                          f"(gptlab tokenizer train --pattern gpt4)")


def _bpe_vocab(tokenizer, n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, types, merges) of a byte-level BPE tokenizer, ids 0 .. n_vocab - 1."""
    table = byte_to_unicode()

    def show(token: bytes) -> str:
        return "".join(table[byte] for byte in token)

    specials = {i: text for text, i in tokenizer.special_tokens.items()}
    tokens, types = [], []
    for i in range(n_vocab):
        if i in specials:
            tokens.append(specials[i])
            types.append(CONTROL)
        elif i in tokenizer.vocab:
            tokens.append(show(tokenizer.vocab[i]))
            types.append(NORMAL)
        else:  # a gap in the ids, or a row the model has past the tokenizer's
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
    return tokens, types, [f"{show(a)} {show(b)}" for a, b in tokenizer.merges]


def _sentencepiece_vocab(tokenizer: SentencePieceTokenizer, n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    pieces = tokenizer.model.pieces
    padding = range(len(pieces), n_vocab)
    return ([piece.text for piece in pieces] + [f"[PAD{i}]" for i in padding], [piece.score for piece in pieces] + [0.0] * len(padding),
            [piece.kind for piece in pieces] + [UNUSED] * len(padding))


def write_tokenizer(writer, tokenizer, n_vocab: int) -> None:
    """Add the tokenizer.ggml.* keys (and the chat template) to a gguf.GGUFWriter."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        tokens, scores, types = _sentencepiece_vocab(tokenizer, n_vocab)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_add_space_prefix(tokenizer.model.normalizer.add_dummy_prefix)
        writer.add_unk_token_id(tokenizer.unk_id)
        bos = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eot_id
    else:
        tokens, types, merges = _bpe_vocab(tokenizer, n_vocab)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(PRE_TOKENIZERS[tokenizer.pattern])
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        bos = tokenizer.eot_id
    if bos is not None:
        writer.add_bos_token_id(bos)
    if tokenizer.eot_id is not None:  # the chat template's eos_token: a conversation starts with it (gptlab.chat)
        writer.add_eos_token_id(tokenizer.eot_id)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if is_chat(tokenizer):
        writer.add_eot_token_id(tokenizer.special_tokens[END])
        writer.add_chat_template(chat_template())


def ollama_modelfile(gguf_name: str, tokenizer) -> str:
    """An Ollama Modelfile for the GGUF file `gguf_name` (beside it): gptlab's chat format as a Go template, stopping
    at <|end|>; for a model without the chat tokens, the prompt as it is, stopping at end-of-text."""
    eot = next((text for text, i in tokenizer.special_tokens.items() if i == tokenizer.eot_id), None)
    lines = [f"FROM ./{gguf_name}"]
    if is_chat(tokenizer):
        role = ROLE_TOKENS
        template = (f"{eot or ''}{{{{ if .System }}}}{role['system']}{{{{ .System }}}}{END}{{{{ end }}}}"
                    f"{{{{ range .Messages }}}}{{{{ if eq .Role \"user\" }}}}{role['user']}{{{{ .Content }}}}{END}"
                    f"{{{{ else if eq .Role \"assistant\" }}}}{role['assistant']}{{{{ .Content }}}}{END}{{{{ end }}}}{{{{ end }}}}"
                    f"{role['assistant']}")
        lines += [f'TEMPLATE """{template}"""', f'PARAMETER stop "{END}"']
    else:
        lines.append('TEMPLATE """{{ .Prompt }}"""')
    if eot is not None:
        lines.append(f'PARAMETER stop "{eot}"')
    return "\n".join(lines) + "\n"


def modelfile_path(gguf_path: str | os.PathLike, *, force: bool = False) -> Path:
    """OUT.Modelfile beside the GGUF file, if it may be written: new, or (with force) an earlier Modelfile of ours."""
    path = Path(gguf_path).with_suffix(".Modelfile")
    if path.absolute() == Path(gguf_path).absolute():  # OUT.Modelfile: the GGUF file would be written where the Modelfile goes
        raise GptlabError(f"OUT {gguf_path} is where --modelfile writes the Modelfile; name the GGUF file "
                          f"{path.with_suffix('.gguf')} (the Modelfile then goes to {path})")
    if path.is_dir() or (path.exists() and not path.read_text(errors="replace").startswith("FROM ./")):
        raise GptlabError(f"{path} exists and is not a Modelfile this command wrote; move it or leave out --modelfile")
    if path.exists() and not force:
        raise GptlabError(f"{path} holds an earlier Modelfile; pass --force to replace it")
    return path


def write_modelfile(gguf_path: str | os.PathLike, tokenizer, *, force: bool = False) -> Path:
    """Write OUT.Modelfile (ollama_modelfile) beside the GGUF file OUT; `ollama create NAME -f OUT.Modelfile` reads it."""
    path = modelfile_path(gguf_path, force=force)
    atomic_write_text(path, ollama_modelfile(Path(gguf_path).name, tokenizer))
    return path
