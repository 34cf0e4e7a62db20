"""The script runner packs its own commands (``_protocol.resp``) only where redis-py would send the same bytes."""

from __future__ import annotations

import asyncio
import enum
from typing import Any
from unittest import mock

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
import redis.utils
import valkey

import hybridlock
import hybridlock._async.backends.redis as async_runner
import hybridlock._sync.backends.redis as sync_runner
from hybridlock._async.backends import _compat as async_compat
from hybridlock._protocol import resp
from hybridlock._sync.backends import _compat as sync_compat
from hybridlock.testing.server import EmbeddedServer

# Every shape of command the runner sends: a script call (digest, key count, keys, owner id, lease and TTLs, the
# channel, the announce mode, empty strings, a place name), the same with a non-ASCII key and extreme numbers, a
# script sent whole after NOSCRIPT (longer than what is kept), a blocking pop with a float timeout, and bytes.
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
    ("EVALSHA", "ab" * 20, 1, "bestellungen:{größe}:ü", "żółw", -1, 0, 2**53 - 1, 2**64, -0.0, 1e16),
    ("EVAL", "return redis.call('GET', KEYS[1])\n" + "-- " * 200, 1, "k"),
    ("BLPOP", "bench:{k}:grant:42f322c4", 0.1),
    ("BLPOP", "bench:{k}:grant:42f322c4", 2.5e-05),
    ("SET", b"raw\x00bytes", b"\xff\xfe"),
]

PACKERS = {
    "blocking": lambda *args: b"".join(redis.connection.Connection().pack_command(*args)),
    "asyncio": lambda *args: b"".join(redis.asyncio.connection.Connection().pack_command(*args)),
}


@pytest.mark.parametrize("side", sorted(PACKERS))
def test_every_command_shape_is_packed_as_redis_py_packs_it(side: str) -> None:
    library = PACKERS[side]
    for shape in SHAPES:
        assert resp.pack_commands([shape]) == library(*shape), shape
        # Twice: the second time from the kept bulk strings.
        assert resp.pack_commands([shape]) == library(*shape), shape
    assert resp.pack_commands(SHAPES) == b"".join(library(*shape) for shape in SHAPES)


def test_what_is_left_to_the_client_library() -> None:
    # redis-py refuses a bool (DataError), and packs types of its own choosing: hybridlock does not guess.
    assert resp.pack_commands([("SET", "k", True)]) is None
    assert resp.pack_commands([("SET", "k", None)]) is None
    assert resp.pack_commands([("SET", "k", bytearray(b"v"))]) is None

    class Level(enum.IntEnum):  # (redis-py sends its repr, "<Level.HIGH: 2>")
        HIGH = 2

    assert resp.pack_commands([("SET", "k", Level.HIGH)]) is None
    # A large value: redis-py sends it without copying it.
    assert resp.pack_commands([("SET", "k", b"v" * (resp._LONGEST_PACKED + 1))]) is None
    assert resp.pack_commands([("SET", "k", "v" * (resp._LONGEST_PACKED + 1))]) is None
    # Command names that redis-py splits, and no command at all.
    assert resp.pack_commands([("SCRIPT LOAD", "return 1")]) is None
    assert resp.pack_commands([(" EVALSHA", "x")]) is None
    assert resp.pack_commands([()]) is None


def test_the_kept_bulk_strings_stay_bounded() -> None:
    kept = dict(resp._PACKED)
    try:
        for i in range(resp._MOST_KEPT + 10):
            resp.pack_commands([("GET", f"key:{i}")])
        assert len(resp._PACKED) <= resp._MOST_KEPT
        resp.pack_commands([("EVAL", "x" * (resp._LONGEST_KEPT + 1))])
        assert "x" * (resp._LONGEST_KEPT + 1) not in resp._PACKED
    finally:
        resp._PACKED.clear()
        resp._PACKED.update(kept)


class _PrefixEncoder(redis.connection.Encoder):
    """An encoder of the user's (one tenant's names moved under a prefix): its connections must pack with it."""

    def encode(self, value: Any) -> Any:
        if isinstance(value, str):
            value = value.replace("resp:prefixed", "tenant1:resp:prefixed")
        return super().encode(value)


@pytest.mark.skipif(redis.utils.HIREDIS_AVAILABLE, reason="with hiredis, the blocking client packs with hiredis")
def test_only_redis_py_s_own_packing_with_its_own_utf8_encoder_is_replaced() -> None:
    assert sync_compat.packs_like_us(redis.connection.Connection())
    assert sync_compat.packs_like_us(redis.connection.Connection(encoding="UTF8"))
    assert not sync_compat.packs_like_us(redis.connection.Connection(encoding="latin-1"))
    assert not sync_compat.packs_like_us(redis.connection.Connection(encoding_errors="replace"))

    class Packer:  # (hiredis's packer, or a user's, in redis-py's place)
        def pack(self, *args: object) -> list[bytes]:
            return []

    assert not sync_compat.packs_like_us(redis.connection.Connection(command_packer=Packer()))
    latin1 = redis.connection.Encoder("latin-1", "strict", False)
    packer = redis.connection.PythonRespSerializer(6000, latin1.encode)
    assert not sync_compat.packs_like_us(redis.connection.Connection(command_packer=packer))
    replaced = redis.connection.Connection()
    replaced.encoder = _PrefixEncoder("utf-8", "strict", False)
    assert not sync_compat.packs_like_us(replaced)

    class OwnPacking(redis.connection.Connection):
        def pack_command(self, *args: object) -> list[bytes]:
            return list(super().pack_command(*args))

    assert not sync_compat.packs_like_us(OwnPacking())
    patched = redis.connection.Connection()
    patched.pack_command = lambda *args: []  # type: ignore[method-assign]
    assert not sync_compat.packs_like_us(patched)
    with mock.patch.object(redis.connection.Encoder, "encode", return_value=b""):
        assert not sync_compat.packs_like_us(redis.connection.Connection())
    assert not sync_compat.packs_like_us(object())
    assert not sync_compat.packs_like_us(valkey.connection.Connection())


def test_the_asyncio_side_trusts_only_redis_py_s_own_packing_and_encoder() -> None:
    assert async_compat.packs_like_us(redis.asyncio.connection.Connection())
    assert not async_compat.packs_like_us(redis.asyncio.connection.Connection(encoding="latin-1"))
    with_encoder = redis.asyncio.connection.Connection(encoder_class=_PrefixEncoder)
    assert not async_compat.packs_like_us(with_encoder)

    class AsyncOwnPacking(redis.asyncio.connection.Connection):
        def pack_command(self, *args: Any) -> list[bytes]:
            return super().pack_command(*args)

    assert not async_compat.packs_like_us(AsyncOwnPacking())
    with mock.patch.object(redis.asyncio.connection.AbstractConnection, "pack_command", return_value=[]):
        assert not async_compat.packs_like_us(redis.asyncio.connection.Connection())
    assert not async_compat.packs_like_us(valkey.asyncio.connection.Connection())


@pytest.mark.skipif(redis.utils.HIREDIS_AVAILABLE, reason="with hiredis, the blocking client packs with hiredis")
def test_a_lock_s_calls_are_packed_here_and_a_user_encoder_s_keys_are_kept(server: EmbeddedServer) -> None:
    calls = []
    real = sync_runner.pack_commands

    def counted(commands: Any) -> Any:
        calls.append(commands)
        return real(commands)

    client = redis.Redis.from_url(server.url)
    with (
        mock.patch.object(sync_runner, "pack_commands", counted),
        hybridlock.LockRegistry(client) as registry,
        registry.obtain("resp:plain"),
    ):
        pass
    client.close()
    assert calls, "the runner did not pack the lock's calls itself"

    # The asyncio client takes the user's encoder class through its pool: the lock's keys are the ones it encodes.
    async def with_prefix() -> list[bytes]:
        pool = redis.asyncio.ConnectionPool.from_url(server.url, encoder_class=_PrefixEncoder)
        client = redis.asyncio.Redis(connection_pool=pool)
        async with hybridlock.AsyncLockRegistry(client) as registry, registry.obtain("resp:prefixed"):
            pass
        await client.aclose()
        await pool.aclose()
        plain = redis.Redis.from_url(server.url)
        keys = sorted(plain.keys("*resp:prefixed*"))
        plain.close()
        return keys

    with mock.patch.object(async_runner, "pack_commands", counted):
        calls.clear()
        keys = asyncio.run(with_prefix())
    assert keys
    assert all(b"{tenant1:resp:prefixed}" in key for key in keys), keys
