"""`gptlab chat MODEL`: talk to a chat model in the terminal, replies streamed as tokens arrive.

    $ gptlab chat runs/sft --system "Be brief."
    >>> What is 2+2?
    4

Each turn renders the whole conversation with the chat format (gptlab.chat.format)
and generates the reply from it; when the conversation no longer fits the model's
context, the oldest turns are dropped and a note says so. From a pipe (stdin not a
terminal) each input line is a message and each reply is printed on its own line,
with no prompt or banner, so `printf 'hi\\nmore\\n' | gptlab chat MODEL` works.

Ctrl-C while the model answers stops that answer (what was shown stays in the
conversation); Ctrl-C at the prompt leaves (exit 130); so do /exit and Ctrl-D (exit 0).
Notes and errors inside the session go to stderr and the session goes on.

With --best-of N --reward SPEC each reply is the best of N candidates sampled together and scored
by the reward with the conversation so far as the prompt (gptlab.align.rl.best_of); the reply is shown
once chosen, with a dim line under it: its reward against the candidates' mean, min and max.
Reply k's candidate j is seeded with seed + k·N + j, so N = 1 replies as without --best-of.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

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

PROMPT = ">>> "
HELP = """\
/clear             forget the conversation (the system prompt stays)
/system TEXT       set the system prompt (/system alone removes it)
/set NAME VALUE    temperature, top_k, top_p, max_tokens or seed (VALUE none unsets); /set alone shows them
/help              this list
/exit              leave (so does Ctrl-D); Ctrl-C stops a reply, and at the prompt leaves"""
SETTINGS = {"temperature": float, "top_k": int, "top_p": float, "max_tokens": int, "seed": int}
KINDS = {float: "a number", int: "a whole number"}
OPTIONAL = ("top_k", "top_p", "seed")  # settings that `none` unsets


def register(stages) -> None:
    parser = stages.add_parser("chat", help="talk to a chat model (after `gptlab sft`) in the terminal")
    add_model_argument(parser, positional=True)
    parser.add_argument("--system", metavar="TEXT", help="system prompt: the first message of the conversation")
    parser.add_argument("--tokenizer", "-t", metavar="DIR|NAME", help="tokenizer folder (default: the model's own)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    parser.add_argument("--top-k", type=int, metavar="K", help="sample from the K most likely tokens only")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling: the most likely tokens holding probability P")
    parser.add_argument("--max-tokens", type=positive, metavar="N",
                        help="longest reply in tokens (default: 512, or half the model's context if smaller)")
    parser.add_argument("--seed", type=int, help="seed for reproducible replies: reply k uses seed + k (default: random)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    add_decoding_arguments(parser)
    add_tool_arguments(parser)
    parser.add_argument("--best-of", type=int, default=1, metavar="N",
                        help="sample N replies per turn and show the one --reward scores highest (default 1)")
    parser.add_argument("--reward", metavar="SPEC", help="what --best-of picks by: rm:DIR (a reward model), judge:URL, "
                        "file.py:function, or weighted sums; the prompt it sees is the conversation so far")
    parser.set_defaults(handler=run_chat)


@dataclass
class Session:
    """One conversation: the model, its chat format, the sampling settings and the messages so far."""

    model: object
    chat_format: object
    settings: dict
    system: str | None = None
    messages: list[dict] = field(default_factory=list)  # user and assistant turns; the system prompt is kept apart
    replies: int = 0  # replies generated so far: reply k is seeded with seed + k (× best_of)
    best_of: int = 1  # candidates per reply
    reward: object = None  # a gptlab.align.rl.best_of.BestOfReward: replies are chosen by it (None: plain sampling)
    draft: object = None  # a draft GPT for speculative decoding (--draft; None: the model alone)
    draft_tokens: int = 4  # tokens the draft guesses per step (--draft-tokens)
    toolbox: object = None  # a gptlab.tools.Toolbox the model may call (--tools; None: no tools)

    def sampling(self, **changes):
        """The SamplingConfig for the next reply (checked: a bad setting raises GptlabError)."""
        from gptlab.infer import SamplingConfig

        settings = {**self.settings, **changes}
        block = self.model.config.block_size
        if settings["max_tokens"] >= block:
            raise GptlabError(f"max_tokens={settings['max_tokens']} leaves no room for the conversation in the "
                              f"model's context ({block} tokens); use at most {block // 2} or so")
        seed = settings["seed"]
        return SamplingConfig(
            max_new_tokens=settings["max_tokens"], temperature=settings["temperature"], top_k=settings["top_k"],
            top_p=settings["top_p"], stop_tokens=self.chat_format.stop_tokens,
            seed=None if seed is None else seed + self.replies * self.best_of, vocab_size=self.chat_format.tokenizer.vocab_size,
        )

    def conversation(self, text: str) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.messages, {"role": "user", "content": text}]

    def answer(self, text: str, write) -> None:
        """Generate the reply to `text`, writing it as it arrives; the exchange joins the conversation."""
        from gptlab.chat.context import fit_context
        from gptlab.chat.text import TextStream
        from gptlab.infer import stream

        config = self.sampling()
        block = self.model.config.block_size
        tools = self.toolbox.specs() if self.toolbox is not None else None
        messages, dropped = fit_context(self.chat_format, self.conversation(text), block - config.max_new_tokens, tools=tools)
        if dropped:
            note(f"(dropped the oldest {dropped} message{'s' * (dropped > 1)} to fit the model's context of {block} tokens)")
        tokenizer = self.chat_format.tokenizer
        kept = messages[1:] if self.system else messages
        if self.toolbox is not None:
            self.keep(kept, self.tool_reply(messages, config, write))
            return
        if self.reward is not None:
            content = self.best_reply(messages, config, write)
        else:
            prompt = self.chat_format.prompt(messages)
            if self.draft is not None:  # same reply when greedy, same distribution when sampled (gptlab.infer.speculative)
                from gptlab.infer.speculative import SpeculativeDecoder

                tokens = ((0, token) for token in SpeculativeDecoder(self.model, self.draft, self.draft_tokens).stream(prompt, config))
            else:
                tokens = stream(self.model, [prompt], config)
            self.replies += 1
            text_stream, reply = TextStream(tokenizer), []
            try:
                for _, token in tokens:
                    reply.append(token)
                    write(text_stream.add(token))
            except KeyboardInterrupt:  # stop this reply only, like llama.cpp and ollama
                tokens.close()
                write(text_stream.flush() + "\n")
                note("(stopped)")
            else:
                write(text_stream.flush() + "\n")
            content = tokenizer.decode(reply)
        if content.strip():
            self.messages = [*kept, {"role": "assistant", "content": content}]
        else:  # an empty message is not a valid turn: leave the exchange out
            self.messages = kept[:-1]
            note("(empty reply: this exchange is not kept in the conversation)")

    def tool_reply(self, messages: list[dict], config, write) -> list[dict]:
        """The reply with the tools running as it is generated: its words streamed, each call shown on a dim line with
        its result; returns the reply's messages (calls, results, the answer) for the conversation."""
        from gptlab.chat.text import ReplyView
        from gptlab.infer import stream
        from gptlab.tools.turn import ToolTurn, reply_messages

        dim, plain = ("\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "")
        turn = ToolTurn(self.chat_format, self.toolbox, on_run=lambda run: write(f"{dim}[{run.describe()}]{plain}\n"))
        tokens = stream(self.model, [self.chat_format.prompt(messages, tools=self.toolbox.specs())], config, tools=[turn])
        self.replies += 1
        view, reply = ReplyView(self.chat_format), []
        try:
            for _, token in tokens:
                reply.append(token)
                write(view.add(token))
        except KeyboardInterrupt:
            tokens.close()
            note("(stopped)")
        write(view.flush() + "\n")
        return reply_messages(self.chat_format, reply)

    def keep(self, kept: list[dict], reply: list[dict]) -> None:
        """The conversation with a tool reply's messages after `kept`, or without the exchange if they would not
        render as a conversation (cut off inside a call, or no answer after the results)."""
        from gptlab.chat.messages import check_messages

        while reply and reply[-1]["role"] == "assistant" and not reply[-1]["content"].strip() and "tool_calls" not in reply[-1]:
            reply.pop()
        finished = bool(reply) and reply[-1]["role"] == "assistant" and "tool_calls" not in reply[-1]
        try:
            check_messages([*kept, *reply])
        except GptlabError:
            finished = False
        if not finished:
            self.messages = kept[:-1]
            note("(the reply did not finish its answer: this exchange is not kept in the conversation)")
            return
        self.messages = [*kept, *reply]

    def best_reply(self, messages: list[dict], config, write) -> str:
        """The best of `best_of` candidate replies by the reward, written once chosen, with its scores under it in dim."""
        from gptlab.align.rl.best_of import best_of_reply
        from gptlab.infer import Engine, EngineConfig
        from gptlab.infer.best_of import describe

        self.replies += 1
        try:
            with Engine(self.model, EngineConfig(slots=self.best_of, draft_tokens=self.draft_tokens), draft=self.draft) as engine:
                result, content = best_of_reply(engine, self.chat_format.tokenizer, self.chat_format.prompt(messages), config,
                                                self.best_of, self.reward, messages)
        except KeyboardInterrupt:  # nothing was shown yet: the turn is dropped
            note("(stopped)")
            return ""
        write(content + "\n")
        dim, plain = ("\033[2m", "\033[0m") if sys.stderr.isatty() else ("", "")
        note(f"{dim}({describe(result.summary())}){plain}")
        return content

    def command(self, line: str) -> bool:
        """Run a /command; False when it asks to leave."""
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/help":
            print(HELP, flush=True)
        elif name == "/clear":
            self.messages = []
            note("(conversation cleared)")
        elif name == "/system":
            self.system = rest or None
            note(f"(system prompt {'set' if rest else 'removed'})")
        elif name == "/set":
            self.set(rest)
        else:
            note(f"unknown command {name}; /help lists the commands")
        return True

    def set(self, text: str) -> None:
        if not text:
            note(" ".join(f"{name}={value}" for name, value in self.settings.items()))
            return
        name, _, value = text.partition(" ")
        name, value = name.replace("-", "_"), value.strip()
        if name not in SETTINGS:
            raise GptlabError(f"unknown setting {name!r}; use one of {', '.join(SETTINGS)}")
        if value.lower() == "none" and name in OPTIONAL:
            parsed = None
        else:
            try:
                parsed = SETTINGS[name](value)
            except ValueError:
                raise GptlabError(f"{name} must be {KINDS[SETTINGS[name]]}, got {value!r}") from None
        self.sampling(**{name: parsed})  # raises when the value is out of range
        self.settings[name] = parsed
        note(f"({name}={parsed})")


def run_chat(args: argparse.Namespace) -> int:
    from gptlab.align.rl.best_of import best_of_reward
    from gptlab.chat import ChatFormat

    reward = best_of_reward(args.best_of, args.reward, where="`gptlab chat` (a conversation, no known answer)")  # before the model: a bad spec costs no compute
    toolbox = load_toolbox(args)
    if toolbox is not None and (args.best_of > 1 or args.draft):
        raise GptlabError("--tools runs with plain sampling: leave out --best-of and --draft")
    model, tokenizer, draft = load_for_decoding(args)
    try:
        chat_format = ChatFormat(tokenizer)
    except GptlabError:
        raise GptlabError(f"{args.checkpoint} is not a chat model: its tokenizer has no chat tokens (<|user|>, "
                          "<|assistant|>, <|end|>); fine-tune it with `gptlab sft` first") from None
    if toolbox is not None:
        check_tool_tokens(args, tokenizer)
    block = model.config.block_size
    max_tokens = args.max_tokens if args.max_tokens is not None else min(512, block // 2)
    settings = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                "max_tokens": max_tokens, "seed": args.seed}
    session = Session(model, chat_format, settings, system=args.system or None, best_of=args.best_of, reward=reward,
                      draft=draft, draft_tokens=args.draft_tokens, toolbox=toolbox)
    session.sampling()  # a bad flag is one error line before the session starts
    interactive = sys.stdin.isatty()
    if interactive:
        import readline  # noqa: F401  line editing and history for input()

        tools = f", tools: {', '.join(toolbox.names)}" if toolbox is not None else ""
        note(f"chatting with {args.checkpoint} (context {block} tokens{tools}); /help for commands, Ctrl-D to leave")
    return converse(session, interactive)


def converse(session: Session, interactive: bool) -> int:
    """The read-answer loop: 0 at /exit or end of input, 130 at Ctrl-C on the prompt."""
    while True:
        try:
            line = input(PROMPT) if interactive else sys.stdin.readline()
        except EOFError:
            line = ""
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130
        if not line:  # end of input (Ctrl-D)
            if interactive:
                print(file=sys.stderr)
            return 0
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        try:
            if text.startswith("/"):
                if not session.command(text.strip()):
                    return 0
            else:
                session.answer(text, write)
        except GptlabError as error:
            note(f"error: {error}")
        if interactive:
            print()


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()

