"""A row's tool loop, as the decoding paths see it: ids only.

After each token the model chooses, a row with a `ToolTurn` asks it what happens next:

    None                      nothing special: a stop token stops the row, any other token is kept
    ToolStep(feed=(...))      the token closed a tool call: keep it, then feed these ids (the tools' results and the
                              assistant's next opening), one per decode step in place of a sampled token, and sample on
    ToolStep(finish="...")    end the row here with this reason (e.g. "tool_calls": a call the client runs), the token
                              not kept, as a stop token is not

Fed tokens count against `max_new_tokens` like sampled ones (they take room in the context) and are never shown
to the turn. `generate`/`stream` (gptlab.infer.generate) and the continuous-batching engine (gptlab.infer.engine)
both honour it, so a batch with tools gives each row the tokens it would get alone.

Not here: what a call is and how tools run (gptlab.tools builds the turns from the chat format and a toolbox).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ToolStep:
    feed: tuple[int, ...] = ()  # ids to feed before sampling again
    finish: str | None = None  # end the row with this reason, dropping the token


class ToolTurn(Protocol):
    def after(self, token: int) -> ToolStep | None:
        """Called with each token the model chose for this row (not with fed ones), in order."""
