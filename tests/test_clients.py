"""The clients hybridlock accepts, how it names their server, and that no message ever shows a password.

Clients here are built but mostly never connected: naming and refusing happen at construction. The tests that
do talk to a server use real ones the suite starts.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import pytest
import redis
import redis.asyncio
import redis.sentinel
import valkey
import valkey.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from valkey.backoff import NoBackoff as ValkeyNoBackoff
from valkey.retry import Retry as ValkeyRetry

import hybridlock
from hybridlock._cli.demo import run_demo
from hybridlock.backends.clients import check_client_settings
from hybridlock.backends.redis import ScriptRunner
from hybridlock.testing.server import _free_port

SECRET = "hunter22-s3cret"


def quiet_redis(**kwargs: object) -> redis.Redis:
    """A redis.Redis with the settings that keep hybridlock's timeout promise (so it draws no warning)."""
    settings: dict[str, object] = {"socket_timeout": 5, "socket_connect_timeout": 5, "retry": Retry(NoBackoff(), 1)}
    return redis.Redis(**{**settings, **kwargs})  # type: ignore[arg-type]


# -- no password in messages -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@127.0.0.1:notaport/0",
        f"redis://alice:{SECRET}@127.0.0.1:notaport/0",
        f"redis://:{SECRET}/x@127.0.0.1:6379/0",  # an unescaped "/" in the password: the parser quotes a piece
        f"http://:{SECRET}@127.0.0.1:6379/0",
        f"redis://127.0.0.1:notaport/0?password={SECRET}",
        f"redis://:{SECRET}@127.0.0.1:6379/0?db=notadb",
    ],
)
def test_a_malformed_url_is_refused_without_showing_its_password(url):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(url)
    message = str(excinfo.value)
    assert "not a valid server URL" in message
    assert SECRET not in message
    assert "s3cret" not in message
    assert "***" in message or "notaport" not in url


def test_redacted_url_hides_the_password_and_nothing_else():
    from hybridlock.backends.clients import redacted_url

    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redacted_url(f"redis://:{SECRET}@h:1/0") == "redis://:***@h:1/0"
    assert redacted_url(f"rediss://alice:{SECRET}@h:1/2") == "rediss://alice:***@h:1/2"
    assert redacted_url(f"redis://{SECRET}@h") == "redis://***@h"
    assert redacted_url(f"redis://h/0?db=1&password={SECRET}") == "redis://h/0?db=1&password=***"
    assert redacted_url(f"unix://:{SECRET}@/tmp/redis.sock?db=1") == "unix://:***@/tmp/redis.sock?db=1"
    sentinel = f"redis+sentinel://h:1/mymaster?sentinel_password={SECRET}&db=zz"
    assert redacted_url(sentinel) == "redis+sentinel://h:1/mymaster?sentinel_password=***&db=zz"


def test_an_invalid_sentinel_url_is_refused_without_its_sentinel_password():
    """Found in review: the sentinels' own password was shown in the error for a bad option."""
    with pytest.raises(hybridlock.InvalidArgumentError) as caught:
        hybridlock.LockRegistry(f"redis+sentinel://127.0.0.1:1/mymaster?sentinel_password={SECRET}&db=zz")
    assert SECRET not in str(caught.value)


@pytest.mark.server
def test_errors_from_a_password_url_never_show_it(own_server):
    setup = redis.Redis.from_url(own_server.url)
    setup.config_set("requirepass", SECRET)
    setup.close()
    port = own_server.port
    with hybridlock.LockRegistry(f"redis://:{SECRET}@127.0.0.1:{port}/0") as registry:
        assert SECRET not in registry.server
        assert SECRET not in repr(registry)
        lock = registry.obtain("k")
        with pytest.raises(hybridlock.LockNotOwnedError) as not_owned:
            lock.release()
        assert not_owned.value.server == f"redis://127.0.0.1:{port}/0"
        with lock:
            pass
    with (
        hybridlock.LockRegistry(f"redis://alice:wrong-{SECRET}@127.0.0.1:{port}/0") as registry,
        pytest.raises(hybridlock.HybridLockError) as excinfo,
    ):
        registry.obtain("k").acquire(timeout=2)
    assert SECRET not in str(excinfo.value)
    assert SECRET not in excinfo.value.server


@pytest.mark.server
def test_a_password_that_is_a_word_of_the_message_is_not_told_by_the_mask(own_server, capsys):
    """Masking every occurrence of the password in the text gave it away: with the password "password", a refused
    login read "the *** given was refused ... username-*** pair". Only the URL's field is masked."""
    setup = redis.Redis.from_url(own_server.url)
    setup.config_set("requirepass", SECRET)
    setup.close()
    url = f"redis://carol:password@127.0.0.1:{own_server.port}/0"
    with hybridlock.LockRegistry(url) as registry, pytest.raises(hybridlock.AuthenticationFailedError) as excinfo:
        registry.obtain("k").acquire(timeout=2)
    message = str(excinfo.value)
    assert "the password given was refused" in message
    assert "invalid username-password pair" in message
    assert "***" not in message  # it names the server without its credentials: nothing to mask
    assert run_demo(url, 1, 1, "k", cycles=1) == 125  # the command line's way: the error's text, masked
    err = capsys.readouterr().err
    assert f"cannot use the server at redis://carol:***@127.0.0.1:{own_server.port}/0" in err
    assert "invalid username-password pair" in err
    assert "carol:password@" not in err


def test_redacted_masks_the_urls_fields_and_quoted_pieces_only():
    from hybridlock.backends.clients import redacted

    url = f"redis://alice:{SECRET}@h:1/0?sentinel_password={SECRET}"
    text = f"at {url}: as '{SECRET}', alice:{SECRET}@h, sentinel_password={SECRET}, \"{SECRET}\""
    assert SECRET not in redacted(text, url)
    cut = f"redis://:{SECRET}/x@127.0.0.1:6379/0"  # the parser quotes the piece before the "/"
    assert redacted(f"Port could not be cast to integer value as '{SECRET}'", cut).endswith("as '***'")
    words = "the password given was refused: invalid username-password pair (username=..., password=...)"
    assert redacted(words, "redis://carol:password@h:1/0") == words


@pytest.mark.server
def test_the_demo_never_prints_the_password(capsys):
    port = _free_port()  # nothing listens there
    status = run_demo(f"redis://:{SECRET}@127.0.0.1:{port}/0", 1, 1, "k", cycles=1)
    err = capsys.readouterr().err
    assert status == 125  # unreachable (the exit-status table: EXIT_FAILED)
    assert "cannot use the server at redis://:***@127.0.0.1" in err
    assert SECRET not in err
    status = run_demo(f"redis://:{SECRET}@127.0.0.1:notaport/0", 1, 1, "k", cycles=1)
    err = capsys.readouterr().err
    assert status == 2
    assert SECRET not in err


# -- the server as the user knows it -----------------------------------------------------------------------------------


def test_a_tls_client_is_named_rediss():
    client = quiet_redis(host="127.0.0.1", port=6390, ssl=True, password=SECRET)  # never connected
    with hybridlock.LockRegistry(client) as registry:
        assert registry.server == "rediss://127.0.0.1:6390/0"
    with hybridlock.LockRegistry(f"rediss://:{SECRET}@127.0.0.1:6390/2") as registry:
        assert registry.server == "rediss://127.0.0.1:6390/2"


def test_a_unix_socket_client_is_named_by_its_path():
    with hybridlock.LockRegistry(f"unix://:{SECRET}@/tmp/no-such-redis.sock?db=1") as registry:
        assert registry.server == "unix:///tmp/no-such-redis.sock"


def test_a_sentinel_managed_master_is_named_by_its_service():
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", _free_port())], socket_timeout=1)  # never connected
    master = sentinel.master_for(
        "orders-primary", password=SECRET, socket_timeout=5, socket_connect_timeout=5, retry=Retry(NoBackoff(), 1)
    )
    with hybridlock.LockRegistry(master) as registry:
        assert registry.server == "sentinel://orders-primary/0"
        with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
            registry.obtain("k").release()
        assert excinfo.value.server == "sentinel://orders-primary/0"


# -- LockNotOwnedError names the server --------------------------------------------------------------------------------


def test_lock_not_owned_carries_the_server_for_every_lock_kind():
    with hybridlock.LocalLockRegistry() as registry:
        rw = registry.obtain_read_write("k")
        kinds = [registry.obtain("k"), rw.read_lock(), rw.write_lock(), registry.obtain_many(["a", "b"])]
        for lock in kinds:
            with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
                lock.release()
            assert excinfo.value.server == registry.server, lock
        with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
            registry.renew_lock("k")
        assert excinfo.value.server == registry.server


def test_lock_upgrade_error_carries_the_server():
    with hybridlock.LocalLockRegistry() as registry:
        rw = registry.obtain_read_write("k")
        with rw.read_lock(), pytest.raises(hybridlock.LockUpgradeError) as excinfo:
            rw.write_lock().acquire()
        assert excinfo.value.server == registry.server


# -- which clients work ------------------------------------------------------------------------------------------------


def test_an_asyncio_client_is_refused_at_construction():
    import redis.asyncio
    import valkey.asyncio

    for client in (redis.asyncio.Redis(), valkey.asyncio.Valkey()):  # never connected
        with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
            hybridlock.LockRegistry(client)
        message = str(excinfo.value)
        assert "an asyncio client" in message
        assert "AsyncLockRegistry" in message
        assert "planned" not in message  # the asyncio API exists: the message must not say it is to come


def test_a_cluster_client_goes_to_the_cluster_backend_of_its_own_side():
    import redis.asyncio.cluster
    import redis.cluster
    import valkey.asyncio.cluster
    import valkey.cluster

    from hybridlock._async.backends.cluster import AsyncRedisClusterBackend
    from hybridlock._async.backends.redis import AsyncRedisBackend
    from hybridlock._sync.backends.cluster import RedisClusterBackend
    from hybridlock._sync.backends.redis import RedisBackend

    # A blocking cluster client connects as it is built; a subclass that skips __init__ is one by type, with no
    # server (nothing here sends a command).
    def stub(cluster_class: type) -> object:
        return type("StubCluster", (cluster_class,), {"__init__": lambda self: None})()

    for blocking, asyncio_class in (
        (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster),
        (valkey.cluster.ValkeyCluster, valkey.asyncio.cluster.ValkeyCluster),
    ):
        assert isinstance(hybridlock.LockRegistry(stub(blocking)).backend, RedisClusterBackend)
        assert isinstance(hybridlock.AsyncLockRegistry(stub(asyncio_class)).backend, AsyncRedisClusterBackend)
        with pytest.raises(hybridlock.InvalidArgumentError, match="asyncio client"):
            hybridlock.LockRegistry(stub(asyncio_class))
        with pytest.raises(hybridlock.InvalidArgumentError, match="blocking client"):
            hybridlock.AsyncLockRegistry(stub(blocking))
        # The one-server backends, given a cluster client directly, point to the cluster ones.
        with pytest.raises(hybridlock.InvalidArgumentError, match="RedisClusterBackend"):
            RedisBackend(stub(blocking))
        with pytest.raises(hybridlock.InvalidArgumentError, match="AsyncRedisClusterBackend"):
            AsyncRedisBackend(stub(asyncio_class))


def quiet_valkey(url: str) -> valkey.Valkey:
    retry = ValkeyRetry(ValkeyNoBackoff(), 1)
    return valkey.Valkey.from_url(url, socket_timeout=5, socket_connect_timeout=5, retry=retry)


@pytest.mark.server
def test_a_valkey_client_runs_every_lock_kind(server, redis_client):
    client = quiet_valkey(server.url)
    try:
        with (
            hybridlock.LockRegistry(client, expire_after=1.0) as registry,
            hybridlock.LockRegistry(server.url) as other,
        ):
            assert registry.server == server.url
            rw = registry.obtain_read_write("v")
            for lock, theirs in (
                (registry.obtain("v"), other.obtain("v")),
                (rw.write_lock(), other.obtain_read_write("v").read_lock()),
                (registry.obtain_many(["v", "w"]), other.obtain("w")),
            ):
                with lock:
                    assert not theirs.acquire(blocking=False)
                assert theirs.acquire(timeout=5)  # a contended wait in the other direction
                done = threading.Event()

                def take(lock=lock, done=done):
                    assert lock.acquire(timeout=5)
                    lock.release()
                    done.set()

                waiter = threading.Thread(target=take)
                waiter.start()
                time.sleep(0.1)
                theirs.release()
                waiter.join(10)
                assert done.is_set(), "the valkey-client registry was never woken by the release"
    finally:
        client.close()


@pytest.mark.server
def test_a_valkey_client_survives_a_cold_script_cache(server, redis_client):
    client = quiet_valkey(server.url)
    try:
        with hybridlock.LockRegistry(client, expire_after=0.3) as registry:
            lock = registry.obtain("cold")
            with lock:
                redis_client.script_flush()
                time.sleep(0.6)  # two lease periods: only renewals (EVALSHA -> NOSCRIPT -> EVAL) kept it
                assert not lock.lost, "the renewer died on valkey's NoScriptError"
            redis_client.script_flush()
            with lock:  # the acquire script too
                pass
            with registry.obtain_many(["a", "b"]) as both:
                redis_client.script_flush()
                registry._context.renewer.renew_once()
                assert not any(part.lost for part in both.locks)
        # The pipelined form (many scripts in one round trip, as a renewal of thousands of locks sends).
        runner = ScriptRunner(client)
        redis_client.script_flush()
        assert runner.run_many("return ARGV[1]", [((), ("x",)), ((), ("y",))]) == [b"x", b"y"]
    finally:
        client.close()


@pytest.mark.server
def test_a_valkey_client_reports_a_dead_server_as_unavailable(own_server):
    client = quiet_valkey(own_server.url)
    try:
        with hybridlock.LockRegistry(client) as registry:
            with registry.obtain("k"):
                pass
            own_server.kill()
            with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
                registry.obtain("k").acquire(timeout=1)
            assert excinfo.value.key == "k"
            assert excinfo.value.server == own_server.url
            assert isinstance(excinfo.value, ConnectionError)
    finally:
        client.close()


# -- the timeout promise with a passed-in client -----------------------------------------------------------------------


def test_a_client_that_cannot_keep_the_timeout_promise_draws_a_warning():
    cases = {
        "retry policy of 10 retries": redis.Redis(),  # redis-py 8's defaults: 5 s timeouts, 10 retries with backoff
        "no socket_timeout": valkey.Valkey(),  # valkey-py's defaults: no timeouts at all
        "no socket_connect_timeout": redis.Redis(
            socket_timeout=None, socket_connect_timeout=None, retry=Retry(NoBackoff(), 1)
        ),
        "retry policy of 3 retries": quiet_redis(retry=Retry(NoBackoff(), 3)),
    }
    for expected, client in cases.items():  # never connected
        with pytest.warns(hybridlock.ClientSettingsWarning, match=expected) as record:
            hybridlock.LockRegistry(client).close()
        assert record[0].filename == __file__, "the warning must point at the caller's line"
        assert "Retry(NoBackoff(), 1)" in str(record[0].message)


def _settings_warning(client: object) -> bool:
    """Whether hybridlock warns about ``client``'s settings (``ClientSettingsWarning``), without failing on it."""
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        check_client_settings(client, "redis://example")
    return any(issubclass(warning.category, hybridlock.ClientSettingsWarning) for warning in record)


def _cannot_keep_the_promise(client: object) -> bool:
    """The truth the warning must tell: a connection the client's pool makes (never connected) has a socket timeout or
    a connect timeout of None (it may wait for ever), or retries more than once."""
    pool = client.connection_pool  # type: ignore[attr-defined]
    connection = pool.connection_class(**pool.connection_kwargs)
    connect = getattr(connection, "socket_connect_timeout", getattr(connection, "_socket_connect_timeout", 0))
    return connection.socket_timeout is None or connect is None or connection.retry._retries > 1


def test_the_settings_warning_follows_the_connections_a_client_makes_however_it_was_built():
    # redis.Redis(host=...) fills in every setting; from_url names only what the URL and the arguments give, and the
    # connection class supplies the rest (valkey-py's Unix socket connection: no socket timeout at all). One rule:
    # what the connections will carry. Checked against connections actually made (never connected).
    settings: list[dict[str, object]] = [
        {},
        {"socket_timeout": None},
        {"socket_connect_timeout": None},  # connections then connect within socket_timeout
        {"socket_timeout": 1},
    ]
    classes = [redis.Redis, redis.asyncio.Redis, valkey.Valkey, valkey.asyncio.Valkey]
    clients: list[object] = []
    for cls in classes:
        for given in settings:
            clients += [cls(host="127.0.0.1", **given), cls.from_url("redis://127.0.0.1:6390/0", **given)]
        clients += [cls(unix_socket_path="/tmp/hybridlock.sock"), cls.from_url("unix:///tmp/hybridlock.sock")]
    wrong = [
        f"{client!r}: cannot keep it {_cannot_keep_the_promise(client)}"
        for client in clients
        if _settings_warning(client) != _cannot_keep_the_promise(client)
    ]
    assert not wrong, wrong


def test_a_client_from_a_url_and_one_from_host_with_the_same_settings_draw_the_same_warning():
    # The same settings draw the same verdict, whichever way the client was built. (All given: the two constructors
    # default them differently, redis.Redis(host=...) to 10 retries, valkey.Valkey(host=...) to no timeouts.)
    timeouts = [(1, 1), (None, 1), (1, None), (None, None)]
    for cls, retry in ((redis.Redis, Retry(NoBackoff(), 1)), (valkey.Valkey, ValkeyRetry(ValkeyNoBackoff(), 1))):
        for socket_timeout, connect_timeout in timeouts:
            given = {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout}
            by_host = cls(host="127.0.0.1", port=6390, retry=retry, **given)  # type: ignore[arg-type]
            by_url = cls.from_url("redis://127.0.0.1:6390/0", retry=retry, **given)
            assert _settings_warning(by_host) == _settings_warning(by_url), (cls.__name__, given)


def test_a_client_with_the_recommended_settings_draws_no_warning():
    # The suite turns warnings into errors: constructing these must stay silent.
    hybridlock.LockRegistry(quiet_redis()).close()
    hybridlock.LockRegistry(quiet_redis(retry=Retry(NoBackoff(), 0))).close()
    hybridlock.LockRegistry(quiet_valkey("redis://127.0.0.1:6390/0")).close()
    hybridlock.LockRegistry("redis://127.0.0.1:6390/0").close()


@pytest.mark.server
@pytest.mark.parametrize("how", ["url", "recommended client"])
def test_acquire_on_a_hung_server_keeps_the_documented_bound(own_server, how):
    # A server frozen with SIGSTOP accepts connections (the kernel does) but never answers. From a URL the bound
    # is the timeout plus one socket timeout (5 s); a client with socket_timeout=1 and one retry: plus 2 x 1 s.
    if how == "url":
        connection: object = own_server.url
        bound = 0.5 + 5.0
    else:
        connection = redis.Redis.from_url(
            own_server.url, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 1)
        )
        bound = 0.5 + 2 * 1.0
    with hybridlock.LockRegistry(connection) as registry:
        lock = registry.obtain("hung")
        with lock:  # connected, scripts loaded
            pass
        own_server.pause()
        try:
            start = time.monotonic()
            outcome: object
            try:
                outcome = lock.acquire(timeout=0.5)
            except hybridlock.BackendUnavailableError as exc:
                outcome = exc
            elapsed = time.monotonic() - start
        finally:
            own_server.resume()
        assert outcome is False or isinstance(outcome, hybridlock.BackendUnavailableError)
        assert getattr(outcome, "key", "hung") == "hung"
        assert elapsed < bound + 3.0, f"acquire(timeout=0.5) took {elapsed:.1f} s on a hung server"


@pytest.mark.server
def test_fenced_set_with_a_valkey_client(own_server):
    from hybridlock.fencing import fenced_set

    client = quiet_valkey(own_server.url)
    try:
        client.script_flush()
        assert fenced_set(client, "{doc}", "a", 5)
        assert not fenced_set(client, "{doc}", "b", 4)
        own_server.kill()
        with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
            fenced_set(client, "{doc}", "c", 6)
        assert excinfo.value.key == "{doc}"
        assert excinfo.value.server == own_server.url
    finally:
        client.close()


# -- the script runner's own connections -------------------------------------------------------------------------------


def test_lock_cycles_reuse_the_runners_connections_and_close_gives_them_back(server):
    client = quiet_redis(port=server.port)
    pool = client.connection_pool
    registry = hybridlock.LockRegistry(client)
    try:
        lock = registry.obtain("spares")
        with lock:
            pass
        taken: list[str] = []
        get_connection = pool.get_connection

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            taken.append(threading.current_thread().name)
            return get_connection(*args, **kwargs)

        pool.get_connection = counted  # type: ignore[method-assign]
        for _ in range(20):
            with lock:
                pass
        # Counted on this thread only: the cycles run here. The registry's own workers may take one meanwhile (its
        # renewer describes the holders with a pipeline of the client's, a second into its life). (Once, in a
        # parallel run, the whole count was 1: which thread took it was not recorded then.)
        here = threading.current_thread().name
        assert here not in taken, (
            f"a lock cycle took a connection from the pool instead of reusing the runner's: {taken}"
        )
    finally:
        registry.close()
    # The client is the caller's: its connections are all back in its pool, none kept by the registry.
    assert not pool._in_use_connections
    assert client.ping()


@pytest.mark.parametrize("how", ["single connection", "subclass"])
def test_clients_the_runner_does_not_take_connections_from_still_work(server, how):
    if how == "single connection":
        client = quiet_redis(port=server.port, single_connection_client=True)
    else:

        class Traced(redis.Redis):  # a wrapper of the kind an APM agent installs: it must see every command
            seen: ClassVar[list[str]] = []

            def execute_command(self, *args, **options):  # type: ignore[no-untyped-def]
                self.seen.append(str(args[0]))
                return super().execute_command(*args, **options)

        client = Traced(port=server.port, socket_timeout=5, socket_connect_timeout=5, retry=Retry(NoBackoff(), 1))
    registry = hybridlock.LockRegistry(client)
    try:
        lock = registry.obtain("through-the-client")
        for _ in range(3):
            with lock:
                assert lock.fencing_token is not None
        if how == "subclass":
            assert "EVALSHA" in Traced.seen
    finally:
        registry.close()
        client.close()


def test_a_kept_connection_the_server_closed_is_reconnected_before_the_next_call(server, redis_client):
    # A client with no retry (the default of redis-py before 6): a kept connection that the server closed while it
    # was idle (its `timeout`, a restart, CLIENT KILL) must be reconnected before it is used, as the pool does for a
    # connection it hands out. Before the fix, the next acquire raised BackendUnavailableError.
    client = quiet_redis(port=server.port, retry=Retry(NoBackoff(), 0))
    registry = hybridlock.LockRegistry(client)
    try:
        lock = registry.obtain("stale")
        with lock:
            pass
        assert redis_client.execute_command("CLIENT KILL TYPE normal SKIPME yes") >= 1
        time.sleep(0.1)
        for _ in range(5):
            with lock:
                assert lock.fencing_token is not None
    finally:
        registry.close()
        client.close()


def test_a_small_pool_keeps_room_for_the_clients_other_users(server):
    # Kept connections count against the pool's limit: in a pool of 4, keeping them would leave none for the
    # caller's own commands (before the fix: "No connection available" after four threads had used locks).
    pool = redis.BlockingConnectionPool(port=server.port, max_connections=4, timeout=1, socket_timeout=5)
    client = redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 1))
    registry = hybridlock.LockRegistry(client, lock_type="spin")
    try:
        locks = [registry.obtain(f"small-pool-{i}") for i in range(4)]
        barrier = threading.Barrier(4)

        def cycle(lock: hybridlock.HybridLock) -> None:
            for _ in range(20):
                barrier.wait(5)
                with lock:
                    pass

        threads = [threading.Thread(target=cycle, args=(lock,)) for lock in locks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert client.ping()
    finally:
        registry.close()
        client.close()
