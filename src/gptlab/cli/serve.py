"""`gptlab serve MODEL`: the OpenAI-compatible API, the web chat and the token viewer (/tokenizer/), on 127.0.0.1:8000 by default.

Binds the loopback address unless --host says otherwise (then warns when there is
no --api-key: anyone who can reach the port can use the model). The port is bound
here before uvicorn starts, so a port in use is one error line. Ctrl-C stops the
server cleanly. Each request is logged to stderr in one line (gptlab.serve.access)
unless --no-access-log. With --reward SPEC requests may ask `best_of` candidates and get the best by that
reward (gptlab.serve.best_of); --best-of N makes N the default. With --tools SPEC (as `gptlab chat --tools`) those
tools are offered to every chat request and run here as the model generates. The app itself is gptlab.serve.app.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys

from gptlab.cli.common import (
    DEVICE_HELP,
    add_decoding_arguments,
    add_model_argument,
    add_tool_arguments,
    check_tool_tokens,
    load_for_decoding,
    load_toolbox,
    positive,
)
from gptlab.runtime import GptlabError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(stages) -> None:
    parser = stages.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API, with a web chat")
    add_model_argument(parser, positional=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--api-key", metavar="KEY", help="require `Authorization: Bearer KEY` on /v1 (default: no key; "
                        "an empty KEY is refused)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    add_decoding_arguments(parser)
    parser.add_argument("--slots", type=positive, default=8, metavar="N", help="requests decoded together (default 8)")
    parser.add_argument("--prefix-cache-mb", type=float, metavar="N",  # None: the engine's default (torch is not imported here)
                        help="MB of prompt-prefix keys/values kept for later requests that start the same way (a shared "
                        "system prompt, a chat's earlier turns); 0 turns it off (default 256)")
    parser.add_argument("--max-tokens-limit", type=positive, default=4096, metavar="N", help="largest max_tokens a request may ask")
    parser.add_argument("--max-request-bytes", type=positive, default=1_000_000, metavar="N", help="largest request body")
    parser.add_argument("--name", help="model name the API reports, and the only `model` requests may name (default: "
                        "the MODEL argument)")
    parser.add_argument("--no-access-log", action="store_true",
                        help="do not print a line per request to stderr (client, method, path, status, seconds, tokens)")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="tokenizer folder or name (default: the model's own)")
    parser.add_argument("--best-of", type=int, default=1, metavar="N",
                        help="answer every request with the best of N candidates by --reward (default 1; a request's "
                        "best_of overrides it)")
    parser.add_argument("--reward", metavar="SPEC", help="the reward best_of picks by: rm:DIR (a reward model), judge:URL, "
                        "file.py:function, or weighted sums; chat requests are scored with their messages as the prompt")
    add_tool_arguments(parser)  # offered to every chat request, run here; --tool-calls and --tool-seconds are per request
    parser.set_defaults(handler=run_serve)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise GptlabError(f"port {port} on {host} is already in use; pick another with --port") from None
        raise GptlabError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gptlab.chat import ChatFormat
    from gptlab.infer import Engine, EngineConfig
    from gptlab.serve.app import build_app, check_api_key

    if not 0 <= args.port <= 65535:
        raise GptlabError(f"--port must be in 0..65535, got {args.port}")
    check_api_key(args.api_key)  # before the model loads: an unset $KEY is refused at once
    from gptlab.align.rl.best_of import best_of_reward

    reward = best_of_reward(args.best_of, args.reward, where="`gptlab serve` (requests carry no known answer)")
    toolbox = load_toolbox(args)  # a bad spec is one line before the model loads
    if toolbox is not None and (args.best_of > 1 or args.draft):
        raise GptlabError("--tools runs with plain sampling: leave out --best-of and --draft")
    chosen = {} if args.prefix_cache_mb is None else {"prefix_cache_mb": args.prefix_cache_mb}
    engine_config = EngineConfig(slots=args.slots, draft_tokens=args.draft_tokens, **chosen)  # a bad value: one line, before loading
    sock = bind(args.host, args.port)
    try:
        model, tokenizer, draft = load_for_decoding(args)
        if toolbox is not None:
            check_tool_tokens(args, tokenizer)
        try:
            chat_format = ChatFormat(tokenizer)
        except GptlabError:
            chat_format = None  # /v1/chat/completions explains; /v1/completions works
        engine = Engine(model, engine_config, draft=draft)
    except BaseException:
        sock.close()
        raise
    try:
        app = build_app(engine, tokenizer, chat_format, args.name or args.checkpoint, api_key=args.api_key,
                        max_request_bytes=args.max_request_bytes, max_tokens_limit=args.max_tokens_limit,
                        access_log=None if args.no_access_log else say, best_of=args.best_of, reward=reward, toolbox=toolbox)
        from gptlab.serve.token_view import build_token_view, model_tokenizers, with_token_view

        app = with_token_view(app, build_token_view(model_tokenizers(args.name or args.checkpoint, tokenizer), api_key=args.api_key))
        port = sock.getsockname()[1]
        shown = f"[{args.host}]" if ":" in args.host else args.host
        say(f"gptlab serve: {args.checkpoint} ({'chat' if chat_format else 'completions only'}, {args.slots} slots)")
        if draft is not None:
            say(f"  speculative decoding: draft {args.draft} guesses {args.draft_tokens} tokens per step")
        if engine_config.prefix_cache_mb:
            say(f"  prefix cache: {engine_config.prefix_cache_mb:g} MB (hits on /health; --prefix-cache-mb 0 turns it off)")
        if reward is not None:
            say(f"  best of {args.best_of} by --reward {args.reward} (a request's best_of overrides it)")
        if toolbox is not None:
            say(f"  tools: {', '.join(toolbox.names)} (run here, offered to every chat request; "
                f"{args.tool_calls} calls, {args.tool_seconds:g} s per request)")
        say(f"  web chat  http://{shown}:{port}/")
        say(f"  API       http://{shown}:{port}/v1   (OpenAI-compatible{', key required' if args.api_key else ''})")
        say(f"  tokens    http://{shown}:{port}/tokenizer/   (the token viewer)")
        if args.host in LOOPBACK:
            say("  bound to this machine only; --host 0.0.0.0 to listen on the network")
        elif not args.api_key:
            say(f"  warning: listening on {args.host} without --api-key: anyone who reaches this port can use the model")
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3, access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.close()
        sock.close()
    return 0


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
