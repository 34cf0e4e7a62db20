"""The script runner packs its own commands (``_protocol.resp``) only where redis-py would send the same bytes."""

from __future__ import annotations

import enum

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection

from hybridlock._async.backends import _compat as async_compat
from hybridlock._protocol import resp
from hybridlock._sync.backends import _compat as sync_compat

# Every shape of command the runner sends: a script call (digest, key count, keys, owner id, lease and TTLs, the
# channel, the announce mode, empty strings, a place name), the same with a non-ASCII key, a script sent whole after
# NOSCRIPT (longer than what is kept), a blocking pop with a float timeout, and bytes.
SHAPES = [
    (
        "EVALSHA",
        "f6d7a2eaf878e893711ab318b122fcd4b4c93f84",
        4,
        "bench:{k}",
        "bench:{k}:fence",
        "bench:{k}:queue",
        "bench:{k}:queue-until",
        "42f322c4-5f3e-4260-9a79-65ff6141599e",
        30000,
        86400000,
        "bench:{k}:wake",
        "publish",
        "0",
        "",
        "42f322c4-5f3e-4260-9a79-65ff6141599e|2d|30000",
    ),
    ("EVALSHA", "ab" * 20, 1, "bestellungen:{größe}:ü", "żółw", -1, 0, 2**53 - 1),
    ("EVAL", "return redis.call('GET', KEYS[1])\n" + "-- " * 200, 1, "k"),
    ("BLPOP", "bench:{k}:grant:42f322c4", 0.1),
    ("BLPOP", "bench:{k}:grant:42f322c4", 2.5e-05),
    ("SET", b"raw\x00bytes", b"\xff\xfe"),
]


def test_every_command_shape_is_packed_as_redis_py_packs_it() -> None:
    connection = redis.connection.Connection()
    for shape in SHAPES:
        assert resp.pack_commands([shape]) == b"".join(connection.pack_command(*shape)), shape
        # Twice: the second time from the kept bulk strings.
        assert resp.pack_commands([shape]) == b"".join(connection.pack_command(*shape)), shape
    assert resp.pack_commands(SHAPES) == b"".join(connection.pack_commands(SHAPES))


def test_an_argument_of_another_type_is_left_to_the_client_library() -> None:
    # redis-py refuses a bool (DataError), and packs types of its own choosing: hybridlock does not guess.
    assert resp.pack_commands([("SET", "k", True)]) is None
    assert resp.pack_commands([("SET", "k", None)]) is None
    assert resp.pack_commands([("SET", "k", bytearray(b"v"))]) is None

    class Level(enum.IntEnum):  # (redis-py sends its repr, "<Level.HIGH: 2>")
        HIGH = 2

    assert resp.pack_commands([("SET", "k", Level.HIGH)]) is None


def test_the_kept_bulk_strings_stay_bounded() -> None:
    resp._PACKED.clear()
    for i in range(resp._MOST_KEPT + 10):
        resp.pack_commands([("GET", f"key:{i}")])
    assert len(resp._PACKED) <= resp._MOST_KEPT
    resp.pack_commands([("EVAL", "x" * (resp._LONGEST_KEPT + 1))])
    assert "x" * (resp._LONGEST_KEPT + 1) not in resp._PACKED


def test_only_redis_py_s_own_packing_with_the_default_encoding_is_replaced() -> None:
    assert sync_compat.packs_like_us(redis.connection.Connection())
    assert sync_compat.packs_like_us(redis.connection.Connection(encoding="UTF8"))
    assert not sync_compat.packs_like_us(redis.connection.Connection(encoding="latin-1"))
    assert not sync_compat.packs_like_us(redis.connection.Connection(encoding_errors="replace"))

    class Packer:  # (hiredis's packer, or a user's, in redis-py's place)
        def pack(self, *args: object) -> list[bytes]:
            return []

    assert not sync_compat.packs_like_us(redis.connection.Connection(command_packer=Packer()))

    class OwnPacking(redis.connection.Connection):
        def pack_command(self, *args: object) -> list[bytes]:
            return super().pack_command(*args)

    assert not sync_compat.packs_like_us(OwnPacking())
    assert not sync_compat.packs_like_us(object())

    assert async_compat.packs_like_us(redis.asyncio.connection.Connection())
    assert not async_compat.packs_like_us(redis.asyncio.connection.Connection(encoding="latin-1"))

    class AsyncOwnPacking(redis.asyncio.connection.Connection):
        def pack_command(self, *args: object) -> list[bytes]:
            return super().pack_command(*args)

    assert not async_compat.packs_like_us(AsyncOwnPacking())
