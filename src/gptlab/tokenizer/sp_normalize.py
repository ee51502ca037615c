"""SentencePiece's normaliser, exactly as the library's normalizer.cc applies it before BPE.

A model's NormalizerSpec holds a precompiled charsmap and three whitespace rules; the trainer
spec adds treat_whitespace_as_suffix, and the model's user-defined pieces are matched first and
left as they are. The charsmap blob is:

    <uint32 little-endian: trie size in bytes> <darts-clone double-array trie> <"\\0"-terminated replacements>

The trie's keys are UTF-8 byte strings; a key's value is the offset of its replacement. At each
position the longest key wins (nmt_nfkc: "\\t" -> " ", "A\\u0301" -> "Á", "\\x07" -> ""); where no
key matches, one character is copied, and a malformed UTF-8 byte becomes U+FFFD (one byte consumed).

Then, with remove_extra_whitespaces, leading and trailing spaces go and runs of spaces become one;
with escape_whitespaces, spaces become "▁"; with add_dummy_prefix, a "▁" goes before the text (or
after it, with treat_whitespace_as_suffix). Worked example, nmt_nfkc with the default options:

    "  Hello\\t\\tﬁ ①  " -> "▁Hello▁fi▁1"

Normalisation is lossy by design, and gptlab is lossy exactly where the library is:
  - NFKC rule sets fold compatibility characters: "ﬁ" -> "fi", "①" -> "1", full-width "Ａ１" -> "A1",
    "²" -> "2", "\\u00a0" (no-break space) -> " "; the _cf sets also fold case ("A" -> "a");
  - the nmt_ sets delete control characters (and U+FFFD) and turn tabs, newlines and "\\r" into spaces;
  - remove_extra_whitespaces collapses space runs and drops leading and trailing spaces (and trailing
    "▁" characters already in the text);
  - a lone surrogate in a str (malformed UTF-8 as the library would see it) becomes three U+FFFD.
Decoding ids gives back the normalised text, never the original.

Two implementations, proven equal by tests/tokenizer/test_sp_normalize.py and both equal to the
library: `normalize_bytes`, a line-by-line port of Normalizer::Normalize walking the trie at every
byte (readable, slow); and `normalize`, the fast path on str. The fast path reads the charsmap's
one-character rules into code-point tables once (FastTables), applies them with numpy gathers, walks
the trie only where a rule may delete or expand a character or a longer key may start (a character
that begins one followed by one that can continue it: combining marks, Hangul jamo), and applies the
whitespace rules as a few str operations (equal to the library's piece-by-piece rules because no
replacement or user-defined symbol holds two spaces in a row; where one does, the port runs). ASCII
text goes through one bytes.translate; the identity map (Llama 2, Mistral) is only str operations.
`normalize_many` applies the tables to many texts in one pass (`FastTables.scan_many`): for short
texts the numpy calls per text, not the work, were the cost.

Not here: reading the .model file (gptlab.tokenizer.sp_model), BPE (gptlab.tokenizer.sentencepiece),
the denormaliser (decoding does not need it).
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from gptlab.runtime import GptlabError
from gptlab.tokenizer.sp_model import SPACE, NormalizerSpec

REPLACEMENT = "\ufffd"  # what the library writes for a malformed UTF-8 byte
SURROGATES = re.compile("[\ud800-\udfff]")
SPACE_RUNS = re.compile("  +")  # two spaces as the literal prefix: sre skips single spaces fast


def _label(unit: int) -> int:
    return unit & 0x800000FF  # a leaf unit keeps bit 31, so it never equals a byte


def _offset(unit: int) -> int:
    return (unit >> 10) << ((unit & 0x200) >> 6)


def _has_leaf(unit: int) -> bool:
    return bool(unit & 0x100)


def _has_surrogates(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")  # faster than a regex scan for [\ud800-\udfff]
    except UnicodeEncodeError:
        return True
    return False


def _utf8(text: str) -> bytes:
    """The bytes the library would see; a lone surrogate goes as its three surrogatepass bytes."""
    return text.encode("utf-8", "surrogatepass")


def utf8_char_length(data: bytes, start: int) -> int:
    """Length of the valid UTF-8 character at data[start], or 0 if malformed (util.cc DecodeUTF8)."""
    first, left = data[start], len(data) - start
    if first < 0x80:
        return 1
    for length, mask, lead, lowest in ((2, 0xE0, 0xC0, 0x80), (3, 0xF0, 0xE0, 0x800), (4, 0xF8, 0xF0, 0x10000)):
        if first & mask != lead:
            continue
        if left < length or any(byte & 0xC0 != 0x80 for byte in data[start + 1:start + length]):
            return 0
        code = first & (0x7F >> length)
        for byte in data[start + 1:start + length]:
            code = code << 6 | byte & 0x3F
        valid = code >= lowest and (code < 0xD800 or 0xE000 <= code <= 0x10FFFF)
        return length if valid else 0
    return 0


class CharsMap:
    """A precompiled charsmap: the double-array trie and the replacement strings it points into."""

    def __init__(self, blob: bytes):
        if len(blob) <= 4:
            raise GptlabError(f"the model's precompiled_charsmap is broken: {len(blob)} bytes, too short to hold a trie")
        (size,) = struct.unpack_from("<I", blob)
        if size >= len(blob) or size < 4:
            raise GptlabError(f"the model's precompiled_charsmap is broken: its trie claims {size} bytes of a {len(blob)}-byte blob")
        self.units = array("I", blob[4:4 + size - size % 4])
        if self.units.itemsize != 4:  # pragma: no cover - every platform gptlab runs on has 4-byte unsigned int
            raise GptlabError("array('I') is not 32-bit on this platform")
        if sys.byteorder == "big":
            self.units.byteswap()  # the blob is little-endian (normalizer.cc swaps on big-endian hosts too)
        self.strings = blob[4 + size:]
        self.root = _offset(self.units[0])
        self._replacements: dict[int, bytes] = {}

    def replacement(self, value: int) -> bytes:
        """The "\\0"-terminated string at offset `value`."""
        found = self._replacements.get(value)
        if found is None:
            end = self.strings.find(b"\0", value)
            found = self._replacements[value] = self.strings[value:end if end >= 0 else len(self.strings)]
        return found

    def child(self, node: int, byte: int) -> int | None:
        """The node reached from `node` by `byte`, or None (one step of commonPrefixSearch)."""
        position = node ^ byte
        if position >= len(self.units) or _label(self.units[position]) != byte:
            return None
        return position

    def leaf(self, position: int) -> int | None:
        """The value stored under the node at `position`, or None when no key ends there."""
        unit = self.units[position]
        if not _has_leaf(unit):
            return None
        return self.units[position ^ _offset(unit)] & 0x7FFFFFFF

    def longest_match(self, data: bytes, start: int) -> tuple[int, bytes] | None:
        """(length, replacement) of the longest key that data[start:] begins with, or None."""
        node, best = self.root, None
        for index in range(start, len(data)):
            position = self.child(node, data[index])
            if position is None:
                break
            value = self.leaf(position)
            if value is not None:
                best = (index + 1 - start, value)
            node = position ^ _offset(self.units[position])
        return None if best is None else (best[0], self.replacement(best[1]))

    def children(self, node: int, low: int = 1, high: int = 255):
        """(byte, position) for every edge leaving `node` with a byte in [low, high]."""
        for byte in range(low, high + 1):
            position = self.child(node, byte)
            if position is not None:
                yield byte, position

    def next_characters(self, node: int):
        """(character, position) for every whole UTF-8 character a path from `node` spells."""
        stack = [(node, b"")]
        while stack:
            at, prefix = stack.pop()
            low, high = (1, 255) if not prefix else (0x80, 0xBF)
            for byte, position in self.children(at, low, high):
                spelled = prefix + bytes([byte])
                need = 1 if spelled[0] < 0xC0 else 2 if spelled[0] < 0xE0 else 3 if spelled[0] < 0xF0 else 4
                if len(spelled) == need:
                    try:
                        yield spelled.decode("utf-8"), position
                    except UnicodeDecodeError:  # not a character: text never spells it
                        pass
                elif len(spelled) < need:
                    stack.append((position ^ _offset(self.units[position]), spelled))

    def character_rules(self) -> tuple[dict[str, str], set[str], set[str]]:
        """The one-character rules, the characters that begin longer keys, and those that can come second."""
        rules, firsts, seconds = {}, set(), set()
        for char, position in self.next_characters(self.root):
            value = self.leaf(position)
            if value is not None:
                rules[char] = _decoded(self.replacement(value))
            below = position ^ _offset(self.units[position])
            following = [second for second, _ in self.next_characters(below)]
            if following:
                firsts.add(char)
                seconds.update(following)
        return rules, firsts, seconds


def _decoded(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise GptlabError(f"the model's precompiled_charsmap holds a replacement that is not UTF-8 ({data[:16]!r})") from None


SIMPLE, EXPANDS, FIRST, SECOND = 1, 2, 4, 8  # per-code-point flags of the fast path's table


class FastTables:
    """A charsmap's one-character rules as code-point tables, for the fast path (numpy gathers, not a trie walk).

    flags[c]: SIMPLE (c -> one character, in mapped[c]), EXPANDS (c -> "" or several characters, or c is a lone
    surrogate), FIRST (c begins a longer key), SECOND (c can follow such a c in a key). A position needs the trie
    only if its flag has EXPANDS, or FIRST with SECOND on the next character.
    """

    def __init__(self, charsmap: CharsMap):
        rules, firsts, seconds = charsmap.character_rules()
        self.flags = np.zeros(0x110000, np.uint8)
        self.mapped = np.arange(0x110000, dtype=np.uint32)
        for key, value in rules.items():
            if len(value) == 1:
                self.flags[ord(key)] |= SIMPLE
                self.mapped[ord(key)] = ord(value)
            else:
                self.flags[ord(key)] |= EXPANDS
        self.flags[0xD800:0xE000] |= EXPANDS
        self.flags[[ord(char) for char in firsts]] |= FIRST
        self.flags[[ord(char) for char in seconds]] |= SECOND
        self.ascii = self._ascii_translation(rules, seconds)

    @staticmethod
    def _ascii_translation(rules: dict[str, str], seconds: set[str]) -> tuple[bytes, bytes] | None:
        """bytes.translate arguments that normalise ASCII text, if the ASCII rules allow (none expands; no key pairs)."""
        if any(char.isascii() for char in seconds):
            return None
        table, delete = bytearray(range(256)), bytearray()
        for key, value in rules.items():
            if not key.isascii():
                continue
            if not value:
                delete.append(ord(key))
            elif len(value) == 1 and value.isascii():
                table[ord(key)] = ord(value)
            else:
                return None
        return bytes(table), bytes(delete)

    def scan(self, text: str) -> tuple[str, list[int]]:
        """(text with every one-character rule applied, the positions where the trie must decide)."""
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        flags = self.flags[points]
        if not flags.any():
            return text, []
        special = (flags & EXPANDS) != 0
        special[:-1] |= ((flags[:-1] << 1) & flags[1:] & SECOND) != 0  # FIRST here, SECOND next
        mapped = text
        if (flags & SIMPLE).any():
            mapped = self.mapped[points].tobytes().decode("utf-32-le", "surrogatepass")
        return mapped, np.flatnonzero(special).tolist()

    def scan_many(self, texts: Sequence[str]) -> list[tuple[str, list[int]]]:
        """`scan` of each text, in one pass over all of them (a few numpy calls per text cost more than the work).

        Exactly `scan` per text: every rule is per character, and the one look across characters (FIRST here,
        SECOND next) is cut at each text's end.
        """
        joined = "".join(texts)
        points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
        flags = self.flags[points]
        if not flags.any():
            return [(text, []) for text in texts]
        ends = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)))
        special = (flags & EXPANDS) != 0
        follows = ((flags[:-1] << 1) & flags[1:] & SECOND) != 0
        last = ends[(ends >= 1) & (ends < len(points))] - 1
        follows[last] = False  # a text's last character has no next one (marked, it would only cost a trie walk)
        special[:-1] |= follows
        mapped = joined
        if (flags & SIMPLE).any():
            mapped = self.mapped[points].tobytes().decode("utf-32-le", "surrogatepass")
        positions = np.flatnonzero(special)
        cuts = np.searchsorted(positions, ends).tolist()
        positions = positions.tolist()
        out, start, first = [], 0, 0
        for end, cut in zip(ends.tolist(), cuts):
            out.append((mapped[start:end], [at - start for at in positions[first:cut]] if cut > first else []))
            start, first = end, cut
        return out


@lru_cache(maxsize=8)
def fast_tables(blob: bytes) -> FastTables:
    """The tables of one charsmap, built once per process (about 0.3 s for an NFKC map)."""
    return FastTables(CharsMap(blob))


class SentencePieceNormalizer:
    """Text -> the string the library's normaliser hands to the BPE model ("▁" for spaces, dummy prefix added)."""

    def __init__(self, spec: NormalizerSpec, *, treat_whitespace_as_suffix: bool = False, user_defined: Sequence[str] = ()):
        self.spec = spec
        self.treat_whitespace_as_suffix = treat_whitespace_as_suffix
        self.user_defined = tuple(sorted({symbol for symbol in user_defined if symbol}, key=len, reverse=True))
        self.charsmap = CharsMap(spec.charsmap) if spec.charsmap else None
        self._user_bytes = tuple(_utf8(symbol) for symbol in self.user_defined)
        self._space = SPACE if spec.escape_whitespaces else " "
        self._prefix = self._space if spec.add_dummy_prefix and not treat_whitespace_as_suffix else ""
        self._suffix = self._space if spec.add_dummy_prefix and treat_whitespace_as_suffix else ""
        self._fast = fast_tables(spec.charsmap) if spec.charsmap else None
        # the str-level whitespace rules equal the library's piece-by-piece ones only if no piece holds "  "
        self._simple_spaces = not any("  " in symbol for symbol in self.user_defined)
        if self.charsmap is not None:
            self._simple_spaces = self._simple_spaces and b"  " not in self.charsmap.strings
        self._users = re.compile("|".join(map(re.escape, self.user_defined))) if self.user_defined else None

    # -- the readable reference: normalizer.cc, step by step, on bytes --------------------------------

    def _prefix_piece(self, data: bytes, start: int) -> tuple[bytes, int]:
        """(normalised piece, bytes consumed) at data[start] (Normalizer::NormalizePrefix)."""
        for symbol in self._user_bytes:  # longest user-defined symbol first, kept as it is
            if data.startswith(symbol, start):
                return symbol, len(symbol)
        match = self.charsmap.longest_match(data, start) if self.charsmap is not None else None
        if match is not None:
            return match[1], match[0]
        length = utf8_char_length(data, start)
        if length == 0:
            return REPLACEMENT.encode(), 1
        return data[start:start + length], length

    def normalize_bytes(self, data: bytes) -> bytes:
        """The library's Normalize on raw bytes (malformed UTF-8 included), one prefix at a time."""
        spec, space = self.spec, self._space.encode()
        start = 0
        if spec.remove_extra_whitespaces:  # leading pieces that normalise to exactly " "
            while start < len(data):
                piece, used = self._prefix_piece(data, start)
                if piece != b" ":
                    break
                start += used
        if start == len(data):
            return b""
        out = bytearray(self._prefix.encode())
        previous_space = spec.remove_extra_whitespaces
        while start < len(data):
            piece, used = self._prefix_piece(data, start)
            start += used
            if previous_space:
                piece = piece.lstrip(b" ")
            if piece:
                out += piece.replace(b" ", space) if spec.escape_whitespaces else piece
                previous_space = piece.endswith(b" ")
            if not spec.remove_extra_whitespaces:
                previous_space = False
        if spec.remove_extra_whitespaces:
            while out.endswith(space):
                del out[-len(space):]
        return bytes(out) + self._suffix.encode()

    def normalize_reference(self, text: str) -> str:
        """`normalize` computed by the byte-level port (slow; the fast path is tested against it)."""
        return self.normalize_bytes(_utf8(text)).decode("utf-8")

    # -- the fast path -----------------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        """The normalised text: exactly the library's, in a few passes of C-speed str operations."""
        if not text:
            return ""
        if not self._simple_spaces:
            return self.normalize_reference(text)
        return self._finish(text, self._rewrite(text))

    def normalize_many(self, texts: Sequence[str]) -> list[str]:
        """`normalize` of each text; the charsmap's tables are applied to all of them at once (short texts: several times faster)."""
        if self._fast is None or not self._simple_spaces:
            return [self.normalize(text) for text in texts]
        texts = texts if isinstance(texts, list) else list(texts)
        ascii_fast = self._users is None and self._fast.ascii is not None  # ASCII text: one bytes.translate each is cheaper
        out = [self.normalize(text) if not text or (ascii_fast and text.isascii()) else None for text in texts]
        rest = [i for i, done in enumerate(out) if done is None]
        for i, (mapped, special) in zip(rest, self._fast.scan_many([texts[i] for i in rest])):
            body = mapped if not special and self._users is None else self._assemble(texts[i], mapped, iter(special))
            out[i] = self._finish(texts[i], body)
        return out

    def _finish(self, text: str, body: str) -> str:
        """The whitespace rules on the rewritten `body` of `text`: collapse and strip, escape, dummy prefix."""
        spec = self.spec
        if spec.remove_extra_whitespaces:
            body = SPACE_RUNS.sub(" ", body).lstrip(" ")
            if not body:  # only spaces (or deleted characters) were left
                return self.normalize_reference(text) if self._suffix else ""
        if spec.escape_whitespaces:
            body = body.replace(" ", SPACE)
        body = self._prefix + body
        if spec.remove_extra_whitespaces:
            body = body.rstrip(self._space)
        return body + self._suffix

    def _rewrite(self, text: str) -> str:
        """The charsmap applied and user-defined symbols kept: every piece concatenated."""
        if self._fast is None:
            if self._users is None and not _has_surrogates(text):
                return text
            mapped, special = text, [match.start() for match in SURROGATES.finditer(text)]
        elif self._users is None and self._fast.ascii is not None and text.isascii():
            return text.encode("ascii").translate(*self._fast.ascii).decode("ascii")
        else:
            mapped, special = self._fast.scan(text)
            if not special and self._users is None:
                return mapped
        return self._assemble(text, mapped, iter(special))

    def _assemble(self, text: str, mapped: str, special) -> str:
        """Copy `mapped` up to each user-defined symbol (kept) or trie position (longest key), in text order."""
        parts, at, size = [], 0, len(text)
        user, user_start, candidate = None, -1, -1  # the next match of each kind (len(text): none left)
        while at < size:
            if user_start < at:
                user = self._users.search(text, at) if self._users is not None else None
                user_start = user.start() if user is not None else size
            while candidate < at:
                candidate = next(special, size)
            start = min(user_start, candidate)
            if start == size:
                break
            parts.append(mapped[at:start])
            if user_start == start:  # user-defined symbols win, as the library's prefix matcher does
                parts.append(user.group())
                at = user.end()
            else:
                replacement, length = self._match_at(text, start)
                parts.append(replacement)
                at = start + length
        parts.append(mapped[at:])
        return "".join(parts)

    def _match_at(self, text: str, start: int) -> tuple[str, int]:
        """(replacement, characters consumed) of the longest charsmap key at text[start], walking the trie."""
        if "\ud800" <= text[start] <= "\udfff":
            return REPLACEMENT * 3, 1  # a lone surrogate: three malformed bytes to the library
        if self.charsmap is None:
            return text[start], 1
        charsmap, node, best = self.charsmap, self.charsmap.root, None
        for index in range(start, len(text)):
            for byte in text[index].encode("utf-8", "surrogatepass"):
                position = charsmap.child(node, byte)
                if position is None:
                    break
                node = position ^ _offset(charsmap.units[position])
            else:
                value = charsmap.leaf(position)
                if value is not None:
                    best = (index + 1 - start, value)
                continue
            break
        if best is None:
            return text[start], 1
        return _decoded(charsmap.replacement(best[1])), best[0]
