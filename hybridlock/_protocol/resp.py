"""Commands as the server reads them (RESP: the request format is the same under RESP2 and RESP3). Pure: arguments
in, bytes out.

The backends send every script call through here instead of the client library's own packer when that packer is
the library's pure-Python one with its default UTF-8 encoding (see ``backends/_compat.packs_like_us``): packing
the 15 arguments of an ACQUIRE that way took about 29 µs of client CPU on the benchmark machine, this about 3 µs.
The arguments that repeat from call to call (the script digest, key names, the owner id, the channel) are packed
once and kept: a lock's calls differ only in a few numbers and ids.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Sequence
from typing import cast

__all__ = ["is_utf8", "pack_commands"]

#: Packed bulk strings of recent string arguments; emptied when it reaches ``_MOST_KEPT`` entries (ids that never
#: repeat, such as wait ids, would otherwise crowd out the ones that do).
_PACKED: dict[str, bytes] = {}
_MOST_KEPT = 4096
#: Longer strings (a script's source, sent once after NOSCRIPT) are packed each time and not kept.
_LONGEST_KEPT = 256
#: Longer arguments (a large ``fenced_set`` value) are left to the client library, which sends them without a copy
#: (its own cutoff: redis-py's ``buffer_cutoff``).
_LONGEST_PACKED = 6000


def _bulk(argument: object) -> bytes | None:
    """``argument`` as a RESP bulk string, encoded as redis-py's default encoder does (UTF-8, ``repr`` of an int or
    a float); None for any other type, subclasses included (the caller lets the client library pack it, or refuse
    it: a bool, say)."""
    kind = type(argument)
    if kind is str:
        text = cast(str, argument)
        packed = _PACKED.get(text)
        if packed is None:
            encoded = text.encode()
            if len(encoded) > _LONGEST_PACKED:
                return None
            packed = b"$%d\r\n%b\r\n" % (len(encoded), encoded)
            if len(encoded) <= _LONGEST_KEPT:
                if len(_PACKED) >= _MOST_KEPT:
                    _PACKED.clear()
                _PACKED[text] = packed
        return packed
    if kind is bytes:
        raw = cast(bytes, argument)
        if len(raw) > _LONGEST_PACKED:
            return None
        return b"$%d\r\n%b\r\n" % (len(raw), raw)
    if kind is int or kind is float:
        encoded = repr(argument).encode()
        return b"$%d\r\n%b\r\n" % (len(encoded), encoded)
    return None


def pack_commands(commands: Sequence[Sequence[object]]) -> bytes | None:
    """``commands`` (each a command name without spaces, then its arguments: str, bytes, int or float) packed into
    one buffer, to be sent in one write; None if a command is empty or its name has spaces (the client library
    splits those), or an argument is of another type or longer than ``_LONGEST_PACKED`` bytes."""
    pieces: list[bytes] = []
    for command in commands:
        if not command or type(command[0]) is not str or command[0].split() != [command[0]]:
            return None
        pieces.append(b"*%d\r\n" % len(command))
        for argument in command:
            packed = _bulk(argument)
            if packed is None:
                return None
            pieces.append(packed)
    return b"".join(pieces)


@functools.lru_cache(maxsize=16)
def is_utf8(encoding: object) -> bool:
    """Whether ``encoding`` (a client's encoder setting) names UTF-8, the only encoding ``pack_commands`` writes."""
    try:
        return isinstance(encoding, str) and codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False
