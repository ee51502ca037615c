"""Token ids as text, what `gptlab tokenizer decode` reads: whitespace-separated integers, inline or in files.

    id_sources(["15496 11 995"])  ->  [("the arguments", "15496 11 995")]
    id_sources(["ids.txt"])       ->  [("ids.txt", "15496 11 995\\n")]
    parse_ids("15496 11 995", "the arguments")  ->  [15496, 11, 995]

Arguments that are all integers are ids, others are files of ids; a mix is refused (a file named like a number is
written ./42). Not here: decoding the ids (gptlab.tokenizer.core).
"""

from __future__ import annotations

import re
from pathlib import Path

from gptlab.runtime import GptlabError
from gptlab.runtime.files import read_inputs

INLINE_IDS = re.compile(r"\s*-?\d+(?:\s+-?\d+)*\s*")  # "15496", "15496 11 995": an argument of decode that is ids


def id_sources(inputs: list[str]) -> list[tuple[str, str]]:
    """(where, text of ids) to decode: the arguments themselves when they are ids, else the files they name."""
    inline = [argument for argument in inputs if INLINE_IDS.fullmatch(argument)]
    if inline and len(inline) == len(inputs):
        return [("the arguments", " ".join(inputs))]
    if inline:
        file_name = next(argument for argument in inputs if not INLINE_IDS.fullmatch(argument))
        raise GptlabError(
            f"decode got ids ({inline[0]}) and a file name ({file_name}); give either ids or files (a file named like a number: ./{inline[0]})"
        )
    missing = next((name for name in inputs if not Path(name).is_file()), None)
    if missing is not None:
        raise GptlabError(f"input file not found: {missing} (decode reads arguments that are all integers as ids, others as files of ids)")
    return list(zip(inputs or ["stdin"], read_inputs(inputs)))


def parse_ids(text: str, where: str) -> list[int]:
    words = text.split()
    bad = next((word for word in words if not re.fullmatch(r"-?\d+", word)), None)
    if bad is not None:
        raise GptlabError(f"{where}: {bad[:40]!r} is not a token id; ids are whitespace-separated integers")
    return [int(word) for word in words]
