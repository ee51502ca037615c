"""A model loaded for decoding (sample, chat, serve): its weights quantised as asked, its tokenizer, and a draft model.

    model, tokenizer, draft = load_for_decoding("runs/shakespeare", "cpu", quantize="int8", draft="runs/tiny")

The draft (speculative decoding) must share the model's tokenizer: when it has one of its own, the fingerprints
are compared, and gptlab.infer.speculative checks the rest. Not here: the flags (gptlab.cli.common), quantising
(gptlab.infer.quantize).
"""

from __future__ import annotations

from gptlab.load.model_folders import check_same_tokenizer, load_model, load_model_tokenizer
from gptlab.runtime import GptlabError


def quantize_loaded(model, scheme: str):
    """The loaded model, quantised in place as `scheme` (--quantize) asks (none: unchanged)."""
    if scheme == "none":
        return model
    from gptlab.infer.quantize import quantize_model

    return quantize_model(model, scheme)


def load_draft(spec: str | None, draft_tokens: int, model, tokenizer, device):
    """The draft model `spec` names (--draft) on `device`, or None; one clear error for K < 1, a missing folder or
    another tokenizer."""
    if spec is None:
        return None
    from gptlab.infer.speculative import check_draft

    if draft_tokens < 1:
        raise GptlabError(f"--draft-tokens must be at least 1, got {draft_tokens}")
    draft, path = load_model(spec, device=device)
    own, _ = load_model_tokenizer(spec, path, draft, None, required=False)
    check_same_tokenizer(tokenizer, own or tokenizer, f"the draft {spec} was trained with another tokenizer than the model's",
                         "train the draft on the same prepared data")
    check_draft(model, draft, draft_tokens)
    return draft


def load_for_decoding(spec: str, device, *, tokenizer: str | None = None, quantize: str = "none", draft: str | None = None,
                      draft_tokens: int = 4):
    """(model, tokenizer, draft or None) for the model `spec` names, as --tokenizer, --quantize and --draft ask."""
    model, path = load_model(spec, device=device)
    model = quantize_loaded(model, quantize)
    loaded, _ = load_model_tokenizer(spec, path, model, tokenizer)
    return model, loaded, load_draft(draft, draft_tokens, model, loaded, device)
