"""ReplyReader on scripted tokens, driven as the engine drives a ToolTurn: the words, the client's calls (streamed
pieces adding up to the whole calls, names and arguments as ChatFormat.parse_reply reads them) and the server's runs."""

from gptlab.chat import ChatFormat
from gptlab.serve.tool_replies import ReplyReader
from gptlab.tokenizer import Tokenizer
from gptlab.tools import load_tools
from gptlab.tools.turn import ToolTurn


def drive(chat: ChatFormat, turn: ToolTurn, script: list[int]) -> tuple[ReplyReader, list, str]:
    """Feed `script` (the model's tokens) through the turn as the engine does; (reader, deltas, finish reason)."""
    reader, deltas, reason = ReplyReader(chat, turn), [], "stop"
    for token in script:
        step = turn.after(token)
        if step is not None and step.finish is not None:
            reason = step.finish
            break
        if step is None and token in chat.stop_tokens:
            break
        deltas += reader.add(token)
        for fed in step.feed if step is not None else ():
            deltas += reader.add(fed)
    return reader, deltas + reader.end(reason), reason


def ids(chat: ChatFormat, *parts) -> list[int]:
    return [token for part in parts for token in ([part] if isinstance(part, int) else chat.encode(part))]


def added_up(deltas) -> tuple[str, list[tuple[str, str]], list[dict]]:
    text, calls, runs = "", {}, []
    for delta in deltas:
        if isinstance(delta, str):
            text += delta
            continue
        for piece in delta.get("tool_calls", ()):
            call = calls.setdefault(piece["index"], ["", ""])
            call[0] += piece.get("function", {}).get("name", "")
            call[1] += piece["function"].get("arguments", "")
        runs += delta.get("tool_runs", [])
    return text, [tuple(call) for _, call in sorted(calls.items())], runs


def test_a_server_call_is_run_and_reported_and_its_syntax_never_shows(chat_model):
    chat = ChatFormat(Tokenizer.load(chat_model / "tokenizer"))
    turn = ToolTurn(chat, load_tools("calculator"), client={"lookup"})
    script = ids(chat, "Let me see. ", chat.call, 'calculator  {"expression": "6 * 7"}  ', chat.end, "It is 42.", chat.end)
    reader, deltas, reason = drive(chat, turn, script)
    assert reason == "stop" and added_up(deltas) == ("Let me see. It is 42.", [], reader.runs)
    assert reader.runs == [{"name": "calculator", "arguments": '{"expression": "6 * 7"}', "result": "42"}] and reader.calls == []


def test_a_turn_calling_a_client_tool_sends_every_call_of_it_to_the_client(chat_model):
    chat = ChatFormat(Tokenizer.load(chat_model / "tokenizer"))
    turn = ToolTurn(chat, load_tools("calculator"), client={"lookup"})
    script = ids(chat, chat.call, 'calculator {"expression": "1+1"}', chat.call, 'lookup {"key": "é and ü"} ', chat.call, "lookup",
                 chat.end)
    reader, deltas, reason = drive(chat, turn, script)
    written = [(call["function"]["name"], call["function"]["arguments"]) for call in chat.parse_reply(script[:-1])[0]["tool_calls"]]
    assert reason == "tool_calls" and reader.runs == []
    text, calls, runs = added_up(deltas)
    assert (text, runs) == ("", []) and calls == [(c["function"]["name"], c["function"]["arguments"]) for c in reader.calls]
    assert sorted(calls) == sorted(written) and ("lookup", "{}") in calls  # the waiting calculator call is sent at the end
    assert len({call["id"] for call in reader.calls}) == 3
