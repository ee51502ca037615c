"""`gptlab chat`: piped conversations print exactly what ChatFormat + generate give, history and commands work,
Ctrl-C stops a reply, and a wrong model is one error line."""

import io
import subprocess
import sys

import pytest

from gptlab.chat import ChatFormat
from gptlab.chat.context import fit_context
from gptlab.cli.main import main
from gptlab.tokenizer import Tokenizer
from tests.chat import reference as chat_reference

MAX_TOKENS = 12


def reference_reply(folder, messages, max_tokens=MAX_TOKENS) -> str:
    return chat_reference.reference_reply(folder, messages, max_tokens)


def chat(monkeypatch, folder, lines, *flags) -> int:
    """Run `gptlab chat` in-process with `lines` piped to stdin."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    return main(["chat", str(folder), "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--device", "cpu", *flags])


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def test_chat_two_turns_match_generate_and_the_second_prompt_holds_the_first_reply(chat_model, monkeypatch, capsys):
    assert chat(monkeypatch, chat_model, ["Good morrow, sir.", "What news?"]) == 0
    first = reference_reply(chat_model, [user("Good morrow, sir.")])
    second = reference_reply(chat_model, [user("Good morrow, sir."), assistant(first), user("What news?")])
    assert first.strip() and second.strip()
    assert capsys.readouterr().out == first + "\n" + second + "\n"


def test_chat_clear_forgets_the_conversation(chat_model, monkeypatch, capsys):
    assert chat(monkeypatch, chat_model, ["Good morrow, sir.", "/clear", "What news?"]) == 0
    first = reference_reply(chat_model, [user("Good morrow, sir.")])
    fresh = reference_reply(chat_model, [user("What news?")])
    captured = capsys.readouterr()
    assert captured.out == first + "\n" + fresh + "\n"
    assert "cleared" in captured.err


def test_chat_system_prompt_is_the_first_message(chat_model, monkeypatch, capsys):
    assert chat(monkeypatch, chat_model, ["What news?"], "--system", "Speak in verse.") == 0
    expected = reference_reply(chat_model, [{"role": "system", "content": "Speak in verse."}, user("What news?")])
    assert capsys.readouterr().out == expected + "\n"
    assert chat(monkeypatch, chat_model, ["/system Speak in verse.", "What news?"]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_chat_set_changes_the_sampling_settings(chat_model, monkeypatch, capsys):
    lines = ["/set temperature 0", "/set max_tokens 5", "/set top_k many", "What news?"]
    assert chat(monkeypatch, chat_model, lines, "--temperature", "1.5") == 0
    captured = capsys.readouterr()
    assert captured.out == reference_reply(chat_model, [user("What news?")], max_tokens=5) + "\n"
    assert "top_k must be a whole number, got 'many'" in captured.err


def test_chat_drops_the_oldest_turns_when_the_context_is_full(chat_model, monkeypatch, capsys):
    """With 200 reply tokens the 256-token context holds 56 prompt tokens: a few turns of this length."""
    lines = ["Now is the winter of our discontent made glorious summer.", "By this sun of York.",
             "And all the clouds that loured upon our house.", "In the deep bosom of the ocean buried."]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    assert main(["chat", str(chat_model), "--temperature", "0", "--max-tokens", "200", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "dropped the oldest" in captured.err
    tokenizer = Tokenizer.load(chat_model / "tokenizer")
    messages, replies = [], []
    for line in lines:  # the same conversation, trimmed by the library function
        messages, _ = fit_context(ChatFormat(tokenizer), [*messages, user(line)], 256 - 200)
        reply = reference_reply(chat_model, messages, max_tokens=200)
        replies.append(reply)
        messages = [*messages, assistant(reply)]
    assert captured.out == "".join(reply + "\n" for reply in replies)


def test_chat_ctrl_c_stops_the_reply_and_the_session_goes_on(chat_model, monkeypatch, capsys):
    import gptlab.infer

    real_stream, calls = gptlab.infer.stream, []

    def interrupted_stream(*args, **kwargs):
        tokens = real_stream(*args, **kwargs)
        calls.append(1)
        if len(calls) > 1:
            return tokens

        def three_then_ctrl_c():
            for _ in range(3):
                yield next(tokens)
            raise KeyboardInterrupt

        return three_then_ctrl_c()

    monkeypatch.setattr(gptlab.infer, "stream", interrupted_stream)
    assert chat(monkeypatch, chat_model, ["Good morrow, sir.", "What news?"]) == 0
    captured = capsys.readouterr()
    partial = reference_reply(chat_model, [user("Good morrow, sir.")], max_tokens=3)
    second = reference_reply(chat_model, [user("Good morrow, sir."), assistant(partial), user("What news?")])
    assert captured.out == partial + "\n" + second + "\n"
    assert "(stopped)" in captured.err


def test_chat_ctrl_c_at_the_prompt_leaves_without_a_traceback(chat_model, monkeypatch, capsys):
    class CtrlC(io.StringIO):
        def readline(self, *_):
            raise KeyboardInterrupt

    monkeypatch.setattr(sys, "stdin", CtrlC())
    assert main(["chat", str(chat_model), "--device", "cpu"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_chat_exit_command_ends_the_session(chat_model, monkeypatch, capsys):
    assert chat(monkeypatch, chat_model, ["/help", "/exit", "What news?"]) == 0
    assert capsys.readouterr().out.startswith("/clear")


def test_chat_from_a_pipe_prints_only_the_replies(chat_model):
    result = subprocess.run([sys.executable, "-m", "gptlab", "chat", str(chat_model), "--temperature", "0",
                             "--max-tokens", str(MAX_TOKENS), "--device", "cpu"],
                            input=b"What news?\n", capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode() == reference_reply(chat_model, [user("What news?")]) + "\n"


def test_chat_bad_model_path_is_one_error_line(tmp_path, capsys):
    assert main(["chat", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gptlab: error:") and err.count("\n") == 1


def test_chat_model_without_chat_tokens_says_to_fine_tune_first(prepared, chat_model, tmp_path, capsys):
    import shutil

    plain = tmp_path / "plain"
    shutil.copytree(chat_model, plain)
    shutil.rmtree(plain / "tokenizer")
    Tokenizer.load(prepared / "tokenizer").save(plain / "tokenizer")
    assert main(["chat", str(plain), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a chat model" in err and "gptlab sft" in err


@pytest.mark.parametrize("max_tokens", ["256", "1000"])
def test_chat_max_tokens_that_fill_the_context_is_one_error_line(chat_model, monkeypatch, capsys, max_tokens):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    assert main(["chat", str(chat_model), "--max-tokens", max_tokens, "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "context (256 tokens)" in err
