"""Best-of-n in the API: `best_of` candidates per prompt, scored by the server's reward, the `n` best returned.

    POST /v1/completions       {"prompt": "Once upon", "best_of": 4}                  (OpenAI's legacy field)
    POST /v1/chat/completions  {"messages": [...], "best_of": 4, "n": 1}               (an extension, as vLLM's)

    choices[i]["best_of"] = {"n": 4, "index": 2, "reward": 0.9, "mean": 0.4, "min": 0.1, "max": 0.9}

`gptlab serve MODEL --reward SPEC [--best-of N]` gives the reward (the CLI builds it: serve never imports
align) and the default best_of; a request's `best_of` overrides it. best_of must be at least n (as OpenAI).
The reward is called as reward(prompt, texts) in a worker thread: the prompt is the messages of a chat
request, the prompt text of a completion. Candidate k is seeded with seed + k. `usage` counts every
candidate's tokens, as OpenAI bills best_of. A streaming request is answered after scoring: the chosen
text arrives as one chunk per choice, then the finish chunk that carries `best_of` (OpenAI refuses
stream with best_of; streaming the chosen reply keeps the web chat and streaming clients working).

A reward that raises answers 500 with its one-line message (the server's reward failed, not the
request) and the server goes on serving. Not here: choosing (gptlab.infer.best_of), the rest of the API
(gptlab.serve.app).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from gptlab.infer.best_of import check_scores, ranked, summarise
from gptlab.runtime import GptlabError
from gptlab.serve.access import usage_slot
from gptlab.serve.generation import Generation, sse
from gptlab.serve.protocol import Sampling
from gptlab.serve.replies import APIError, Reply, until_disconnected

RewardFn = Callable[[object, list[str]], list[float]]  # (prompt: text or messages, candidate texts) -> a score each


def candidates_wanted(body: Sampling, default: int, reward: RewardFn | None) -> int:
    """Candidates per prompt: the request's best_of, else the server's (at least n); 1 is plain sampling."""
    if body.best_of is not None:
        if body.best_of < body.n:
            raise APIError(400, f"best_of ({body.best_of}) must be at least n ({body.n}): n of the best_of candidates "
                           "are returned", param="best_of")
        count = body.best_of
    else:
        count = max(default, body.n) if default > 1 else 1
    if count > 1 and reward is None:
        raise APIError(400, f"best_of={count} needs a reward to choose by, and this server has none; start it with "
                       "`gptlab serve MODEL --reward SPEC`", param="best_of", code="best_of_unavailable")
    return count


async def respond_best_of(runner, body: Sampling, prompts: list[list[int]], reward_prompts: list, stop_tokens: tuple[int, ...],
                          count: int, reward: RewardFn, *, chat: bool, http: Request | None = None):
    """Sample `count` candidates of each prompt, score them, and answer with the n best of each. `runner` is
    gptlab.serve.app's Runner (its engine, tokenizer, model_name and configs), which calls this."""
    wide = body.model_copy(update={"n": count})  # Runner.configs gives candidate k the seed + k
    loop = asyncio.get_running_loop()
    groups: list[list[Generation]] = []
    try:
        for prompt in prompts:
            group = []
            groups.append(group)
            for config in runner.configs(wide, prompt, stop_tokens):
                group.append(Generation(runner.engine, runner.engine.submit(prompt, config, loop=loop), runner.tokenizer,
                                        body.stop_strings(), context=() if chat else prompt))
    except GptlabError as error:
        cancel(groups)
        raise APIError(400, str(error)) from None
    everything = [generation for group in groups for generation in group]
    reply = Reply(chat, runner.model_name, sum(len(prompt) for prompt in prompts))
    if http is not None and (slot := usage_slot(http.scope)) is not None:
        slot["usage"] = lambda: reply.usage(everything)
    try:
        texts = await until_disconnected(asyncio.gather(*(generation.text() for generation in everything)), http)
    finally:
        cancel(groups)
    if texts is None:  # the client left: nobody reads an answer
        return Response(status_code=499)
    if any(generation.finish_reason == "error" for generation in everything):
        raise APIError(500, "generation failed on the server", type="server_error")
    chosen, summaries = await choose_best(groups, texts, reward_prompts, reward, body.n)
    answer = reply.whole([texts[everything.index(generation)] for generation in chosen], chosen)
    answer["usage"] = reply.usage(everything)
    for choice, summary in zip(answer["choices"], summaries):
        choice["best_of"] = summary
    if body.stream:
        return StreamingResponse(stream_answer(reply, answer, body.include_usage(), everything), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return answer


async def choose_best(groups: list[list[Generation]], texts: list[str], reward_prompts: list, reward: RewardFn,
                      n: int) -> tuple[list[Generation], list[dict]]:
    """The n best generations of each group by the reward (scored in a worker thread), and their summaries."""
    chosen, summaries, start = [], [], 0
    for group, prompt in zip(groups, reward_prompts):
        candidates = texts[start : start + len(group)]
        start += len(group)
        try:
            scores = check_scores(await asyncio.to_thread(reward, prompt, candidates), len(group))
        except GptlabError as error:
            raise APIError(500, f"the server's best-of reward failed: {error}", type="server_error", code="reward_failed") from None
        except Exception as error:  # the reward is the operator's code: report it, keep serving
            raise APIError(500, f"the server's best-of reward raised {type(error).__name__}: {error}", type="server_error",
                           code="reward_failed") from None
        for index in ranked(scores)[:n]:
            chosen.append(group[index])
            summaries.append(summarise(scores, index))
    return chosen, summaries


async def stream_answer(reply: Reply, answer: dict, include_usage: bool, generations: list[Generation]) -> AsyncIterator[str]:
    """A finished answer as OpenAI's chunks: per choice its role, its whole text, then its finish with best_of."""
    extra = {"usage": None} if include_usage else {}
    for choice in answer["choices"]:
        index = choice["index"]
        text = choice["message"]["content"] if reply.chat else choice["text"]
        if reply.chat:
            yield sse({**reply.chunk(index, None, None, role=True), **extra})
        yield sse({**reply.chunk(index, text, None), **extra})
        last = reply.chunk(index, None, choice["finish_reason"])
        last["choices"][0]["best_of"] = choice["best_of"]
        yield sse({**last, **extra})
    if include_usage:
        yield sse(reply.usage_chunk(generations))
    yield "data: [DONE]\n\n"


def cancel(groups: list[list[Generation]]) -> None:
    for group in groups:
        for generation in group:
            generation.cancel()
