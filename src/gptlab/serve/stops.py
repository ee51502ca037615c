"""Stop strings on streamed text: cut the output at the first stop string, never sending any part of it.

Text arrives in pieces; a piece may end with the start of a stop string ("...\\nUs" with
stop "\\nUser:"), so that tail is held back until the next piece says whether it completes it:

    matcher = StopMatcher(["\\nUser:"])
    matcher.push("Hello\\nUs")   -> "Hello"       ("\\nUs" held back)
    matcher.push("er: hi")      -> ""            stopped; "\\nUser: hi" is never sent
    matcher.stopped             -> True

Not here: stop tokens (gptlab.infer.engine), ids to characters (gptlab.chat.text).
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [stop for stop in stops if stop]
        self.held = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """The text that can safely be sent now; after a stop string, "" forever."""
        if self.stopped:
            return ""
        self.held += text
        cut = min((position for stop in self.stops if (position := self.held.find(stop)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.held = self.held[:cut], ""
            return out
        keep = self._partial_tail()
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out

    def flush(self) -> str:
        """At the end of generation: whatever was held back (it never became a stop string)."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out

    def _partial_tail(self) -> int:
        """Length of the longest tail of the held text that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.held)), longest, -1):
                if self.held.endswith(stop[:size]):
                    longest = size
                    break
        return longest
