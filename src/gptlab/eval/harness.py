"""EleutherAI lm-evaluation-harness adapter: gptlab models as the lm_eval model "gptlab".

    from gptlab.eval.harness import evaluate_harness
    results = evaluate_harness(model, tokenizer, ["hellaswag", "lambada_openai"], limit=100)
    print(results_table(results))

    # or lm_eval's own entry point, once this module is imported:
    lm_eval.simple_evaluate(model="gptlab", model_args="pretrained=DIR,tokenizer=DIR", tasks=[...])

lm_eval asks three kinds of questions, in text; we answer them on ids:

    loglikelihood(context, continuation)  -> (sum log p(continuation | context), every token greedy?)
    loglikelihood_rolling(document)       -> sum log p(document | end-of-text), in windows of block_size
    generate_until(context, gen_kwargs)   -> text up to the first `until` string, end-of-text or max_gen_toks

Text becomes ids as in lm-eval's Hugging Face adapter (we inherit TemplateLM
for it): the continuation's ids are encode(context + continuation) minus the
ids of encode(context), trailing spaces of the context move to the
continuation, and an empty context becomes the end-of-text token. Rolling
windows are lm-eval's get_rolling_token_windows(context_len=1): the first is
conditioned on end-of-text, later ones on as much of the document as fits.
Scoring is gptlab.eval.scoring (batched, contexts cut on the left to fit);
generation is gptlab.infer (greedy unless the task asks for do_sample), and
its text is cut at the first stop string, as lm-eval does.

The tokenizer is any object with `encode(text) -> ids` and `decode(ids) ->
text` (`encode_ordinary` is used when it has one, so text that spells a
special token is scored as plain text) and an end-of-text id (`eot_id`, or
pass `eot_token_id`). Why gptlab.tokenizer is imported by name in
`load_tokenizer`: the eval stage may not import the tokenizer stage
(STYLE.md, Layout), and Python callers pass a tokenizer object in. But lm_eval
builds registered models from strings (`--model_args tokenizer=DIR`), with
nobody to hand us an object, so only then do we load one by module name; we
use it for encode/decode and nothing else.

Importing this module imports lm_eval (an optional dependency, `pip install
lm-eval`) and registers the "gptlab" model; nothing else in gptlab imports it
until it is asked for. Not here: the models (gptlab.model), tasks of our own
(gptlab.eval.tasks), lm_eval's task definitions and datasets (lm_eval fetches
those through Hugging Face datasets; offline, only tasks already in the local
cache or defined over local files work).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from gptlab.eval.scoring import count_truncated, rolling_requests, score_continuations
from gptlab.infer.generate import SamplingConfig, stream
from gptlab.model.gpt import GPT
from gptlab.model.hf import from_pretrained
from gptlab.runtime import GptlabError
from gptlab.runtime.device import autocast, detect_device, resolve_precision

logger = logging.getLogger(__name__)

GPT2_VOCAB_SIZE = 50257  # a model of this vocabulary without a tokenizer beside it is GPT-2's
MAX_GEN_TOKS_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")  # lm-eval's order


def load_tokenizer(spec: str):
    """A tokenizer directory or a name ("gpt2"), through gptlab.tokenizer, imported by name (see the module docstring)."""
    return importlib.import_module("gptlab.tokenizer.pretrained").load_any(spec)


def _default_tokenizer(pretrained: str, model: GPT):
    """DIR/tokenizer beside the model, else GPT-2's for a GPT-2-sized vocabulary."""
    beside = Path(pretrained).expanduser() / "tokenizer"
    if beside.is_dir():
        return load_tokenizer(str(beside))
    if model.config.vocab_size == GPT2_VOCAB_SIZE:
        return load_tokenizer("gpt2")
    raise GptlabError(f"no tokenizer for {pretrained}: {beside} does not exist; pass tokenizer=DIR (or tokenizer=gpt2)")


def _batch_size(value) -> int:
    """lm_eval passes batch sizes as ints or strings ("16"); "auto" needs probing we do not do."""
    try:
        size = int(value)
    except (TypeError, ValueError):
        raise GptlabError(f"batch_size must be a whole number (\"auto\" is not supported here), got {value!r}") from None
    if size < 1:
        raise GptlabError(f"batch_size must be at least 1, got {size}")
    return size


def cut_at_stops(text: str, stops: Sequence[str]) -> str:
    """text up to the earliest stop string: cut_at_stops("4\\n\\nQ: 5", ["\\n\\n", "Q:"]) -> "4"."""
    for stop in stops:
        if stop:
            text = text.split(stop, 1)[0]
    return text


@register_model("gptlab")
class GptlabLM(TemplateLM):
    """A gptlab model (and its tokenizer) answering lm_eval's requests.

    `pretrained`: a GPT, or a gptlab model/checkpoint directory, a Hugging Face
    GPT-2/Llama directory, or a hub name in the local cache ("gpt2").
    `tokenizer`: an object (see the module docstring), a tokenizer directory
    or "gpt2"; default DIR/tokenizer. `precision`: fp32, bf16, fp16 or auto
    (autocast for the forward passes). `max_gen_toks`: for generation tasks
    that name no limit. `seed`: for tasks that sample (do_sample).
    """

    def __init__(
        self,
        pretrained: GPT | str,
        tokenizer=None,
        *,
        batch_size: int | str = 16,
        device: str | None = None,
        precision: str = "fp32",
        max_gen_toks: int = 256,
        eot_token_id: int | None = None,
        seed: int | None = 1234,
        max_batch_size: int | None = None,  # lm_eval passes it; only batch_size="auto" would use it
    ) -> None:
        super().__init__()
        if isinstance(pretrained, GPT):
            model = pretrained if device is None else pretrained.to(detect_device(device))
        else:
            model = from_pretrained(str(pretrained), device=detect_device(device or "auto")).eval()
            if tokenizer is None:
                tokenizer = _default_tokenizer(str(pretrained), model)
        if tokenizer is None:
            raise GptlabError("a tokenizer is needed to turn task text into ids: pass tokenizer=DIR, gpt2, or a tokenizer object")
        if isinstance(tokenizer, (str, Path)):
            tokenizer = load_tokenizer(str(tokenizer))
        vocab = getattr(tokenizer, "vocab_size", None)
        if vocab is not None and vocab > model.config.vocab_size:
            raise GptlabError(f"the tokenizer has {vocab} ids but the model only {model.config.vocab_size}: is it the model's tokenizer?")
        eot = eot_token_id if eot_token_id is not None else getattr(tokenizer, "eot_id", None)
        if eot is None:
            raise GptlabError("the tokenizer has no end-of-text token, which conditions empty contexts and documents; pass eot_token_id=ID")
        self.model = model  # scoring and generation switch it to eval mode while they run, and back
        self.tokenizer = tokenizer
        self._encode = getattr(tokenizer, "encode_ordinary", None) or tokenizer.encode
        self._eot = int(eot)
        self._tokenizer_vocab = vocab if vocab is not None else model.config.vocab_size
        self._device = next(model.parameters()).device
        self.batch_size = _batch_size(batch_size)
        self.precision = resolve_precision(precision, self._device)
        self.max_gen_toks = int(max_gen_toks)
        self.seed = seed

    # ------------------------------------------------------------ what TemplateLM asks of us

    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return list(self._encode(string))

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def _autocast(self):
        return autocast(self._device, self.precision)  # a fresh context each time; a no-op for fp32

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(logprob, greedy) per (context ids, continuation ids); an empty continuation scores (0.0, True)."""
        wanted = [i for i, (_, continuation) in enumerate(pairs) if continuation]
        truncated = count_truncated([pairs[i] for i in wanted], self.max_length)
        if truncated:
            logger.warning("%d of %d requests are longer than the context (%d tokens): their contexts lose tokens on the left",
                           truncated, len(wanted), self.max_length)
        scores = score_continuations(self.model, [pairs[i] for i in wanted], self.batch_size, self._device, autocast=self._autocast())
        results = [(0.0, True)] * len(pairs)
        for i, score in zip(wanted, scores):
            results[i] = (score.logprob, score.greedy)
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context ids, continuation ids), as TemplateLM.loglikelihood makes them."""
        results = self._score([(list(context), list(continuation)) for _, context, continuation in requests])
        for (texts, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", texts, result)
        return results

    # ------------------------------------------------------------ the other two request kinds

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood, conditioned on end-of-text, every token scored once (see scoring.rolling_requests)."""
        pairs, owners = [], []
        for index, request in enumerate(requests):
            (document,) = request.args
            windows = rolling_requests(self.tok_encode(document), self.max_length, prefix_token=self._eot)
            pairs += [(list(context), list(continuation)) for context, continuation in windows]
            owners += [index] * len(windows)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(pairs)):
            totals[owner] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continuations, batched among requests with the same generation options, longest prompts first."""
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(index)
        outputs: list[str] = [""] * len(requests)
        for indices in groups.values():
            config, stops = self.generation_settings(requests[indices[0]].args[1])
            prompts = [self.tok_encode(requests[i].args[0]) or [self._eot] for i in indices]
            order = sorted(range(len(indices)), key=lambda j: len(prompts[j]), reverse=True)
            for start in range(0, len(order), self.batch_size):
                chosen = order[start : start + self.batch_size]
                texts = self._generate_batch([prompts[j] for j in chosen], config, stops)
                for j, text in zip(chosen, texts):
                    outputs[indices[j]] = text
                    self.cache_hook.add_partial("generate_until", requests[indices[j]].args, text)
        return outputs

    def generation_settings(self, options: dict) -> tuple[SamplingConfig, list[str]]:
        """lm-eval's generation options -> our SamplingConfig and the stop strings (end-of-text's text included).

        Greedy unless do_sample (or a positive temperature without do_sample);
        max_gen_toks (or an alias) caps the new tokens, else self.max_gen_toks.
        """
        options = dict(options or {})
        until = options.pop("until", None)
        stops = [until] if isinstance(until, str) else list(until or [])
        if not all(isinstance(stop, str) for stop in stops):
            raise GptlabError(f"until must be a string or a list of strings, got {until!r}")
        eot_text = self.tok_decode([self._eot])
        if eot_text and eot_text not in stops:
            stops.append(eot_text)
        limits = [limit for limit in (options.pop(key, None) for key in MAX_GEN_TOKS_KEYS) if limit is not None]
        max_new = int(limits[0]) if limits else self.max_gen_toks
        temperature = options.pop("temperature", None)
        do_sample = options.pop("do_sample", None)
        if do_sample is None:
            do_sample = bool(temperature)
        top_k, top_p = options.pop("top_k", None), options.pop("top_p", None)
        seed = options.pop("seed", self.seed)
        if options:
            logger.warning("gptlab ignores these generation options: %s", ", ".join(sorted(options)))
        if not do_sample or temperature == 0:  # temperature 0 with do_sample: still greedy, as in Hugging Face
            return SamplingConfig(max_new_tokens=max_new, temperature=0.0), stops
        return SamplingConfig(
            max_new_tokens=max_new,
            temperature=float(1.0 if temperature is None else temperature),
            top_k=None if top_k is None else int(top_k),
            top_p=None if top_p is None else float(top_p),
            seed=seed,
        ), stops

    def _generate_batch(self, prompts: list[list[int]], config: SamplingConfig, stops: list[str]) -> list[str]:
        """Decode until every row has met a stop string, end-of-text or max_new_tokens; prompts keep their last tokens to fit."""
        new_tokens: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        with self._autocast():
            steps = stream(self.model, prompts, config, truncate=True)
            try:
                for row, token in steps:
                    if done[row]:
                        continue
                    if token == self._eot:
                        done[row] = True
                    elif token < self._tokenizer_vocab:  # ids past the tokenizer's (a padded model vocabulary) have no text
                        new_tokens[row].append(token)
                        text = self.tok_decode(new_tokens[row])
                        done[row] = any(stop and stop in text for stop in stops)
                    if all(done):
                        break
            finally:
                steps.close()
        return [cut_at_stops(self.tok_decode(tokens), stops) for tokens in new_tokens]

    def get_model_info(self) -> dict:
        """What lm_eval records about the model in results["config"]."""
        config = self.model.config
        return {"model_arch": config.arch, "model_num_parameters": self.model.num_params(),
                "model_block_size": config.block_size, "precision": self.precision}


def evaluate_harness(
    model: GPT | str,
    tokenizer=None,
    tasks: Sequence[str] = (),
    *,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 16,
    device: str | None = None,
    precision: str = "fp32",
    include_path: str | Path | None = None,
    include_defaults: bool = True,
    bootstrap_iters: int = 100_000,
    log_samples: bool = False,
    seed: int = 1234,
) -> dict:
    """lm_eval.simple_evaluate on our model: the results dict (`results[task][metric]`, configs, versions, ...).

    `model`/`tokenizer` as GptlabLM takes them; `tasks`: lm-eval task names
    (or group names). `include_path`: a directory of extra task YAMLs, with
    lm-eval's built-in tasks too unless include_defaults=False. `limit`: the
    first N examples of each task (a float < 1: that fraction). Stderrs take
    `bootstrap_iters` resamples (0: none).
    """
    import lm_eval

    if isinstance(tasks, str) or not tasks:
        raise GptlabError(f"tasks must be a non-empty list of lm-eval task names, e.g. ['hellaswag'], got {tasks!r}")
    lm = GptlabLM(model, tokenizer, batch_size=batch_size, device=device, precision=precision, seed=seed)
    manager = task_manager(tasks, include_path, include_defaults)
    unknown = [task for task in tasks if task not in manager.all_tasks and not Path(task).is_file()]
    if unknown:
        raise GptlabError(f"unknown lm-eval tasks: {', '.join(unknown)} (`lm_eval ls tasks` lists them; "
                          f"local task YAMLs need include_path)")
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        limit=limit,
        bootstrap_iters=bootstrap_iters,
        log_samples=log_samples,
        task_manager=manager,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )


def task_manager(tasks: Sequence[str], include_path: str | Path | None, include_defaults: bool):
    """lm-eval's task index. Indexing its thousands of built-in task YAMLs takes ~10 s, so when every task asked for
    is a plain task of `include_path` (not a group, which may name built-in tasks), that folder alone is indexed."""
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if not include_defaults or all(task in local.all_subtasks or Path(task).is_file() for task in tasks):
            return local
    return TaskManager(include_path=None if include_path is None else str(include_path), include_defaults=include_defaults)


def results_table(results: dict) -> str:
    """lm-eval's markdown table of every task's metrics (and of groups, when there are any)."""
    from lm_eval.utils import make_table

    table = make_table(results)
    if results.get("groups"):
        table += "\n" + make_table(results, "groups")
    return table
