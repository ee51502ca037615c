from hypothesis import given
from hypothesis import strategies as st

from gptlab.chat.text import TextStream
from gptlab.tokenizer import Tokenizer

TOKENIZER = Tokenizer.train(["héllo wörld ☃ naïve café 日本語"] * 3, vocab_size=280)


@given(st.text(max_size=40))
def test_text_stream_joins_to_the_decoded_text(text):
    ids = TOKENIZER.encode_ordinary(text)
    stream = TextStream(TOKENIZER)
    pieces = [stream.add(token) for token in ids] + [stream.flush()]
    assert "".join(pieces) == TOKENIZER.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)
