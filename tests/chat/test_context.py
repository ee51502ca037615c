"""fit_context: the oldest turns go first; the system message and the newest user message always stay."""

import pytest

from gptlab.chat import ChatFormat
from gptlab.chat.context import fit_context
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

CONVERSATION = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "one one one"}, {"role": "assistant", "content": "two two two"},
                {"role": "user", "content": "three three"}, {"role": "assistant", "content": "four four"},
                {"role": "user", "content": "five"}]


@pytest.fixture(scope="module")
def chat_format(chat_model):
    return ChatFormat(Tokenizer.load(chat_model / "tokenizer"))


def test_fit_context_keeps_everything_that_fits(chat_format):
    room = len(chat_format.prompt(CONVERSATION))
    assert fit_context(chat_format, CONVERSATION, room) == (CONVERSATION, 0)


def test_fit_context_drops_whole_turns_oldest_first(chat_format):
    without_first_turn = [CONVERSATION[0], *CONVERSATION[3:]]
    room = len(chat_format.prompt(without_first_turn))
    assert fit_context(chat_format, CONVERSATION, room) == (without_first_turn, 2)
    newest_only = [CONVERSATION[0], CONVERSATION[-1]]
    assert fit_context(chat_format, CONVERSATION, len(chat_format.prompt(newest_only))) == (newest_only, 4)


def test_fit_context_raises_when_the_newest_message_alone_is_too_long(chat_format):
    with pytest.raises(GptlabError, match="shorten it"):
        fit_context(chat_format, CONVERSATION, 3)
