import types

import pytest

import hybridlock


def test_one_owner_excludes_another(any_registry_factory):
    first, second = any_registry_factory(), any_registry_factory()
    a, b = first.obtain("k"), second.obtain("k")
    assert a.acquire(timeout=1)
    assert not b.acquire(blocking=False)
    a.release()
    assert b.acquire(timeout=1)
    b.release()


def test_public_surface_is_exactly_all():
    # Submodules (errors, backends, fencing) are reached by their own names; everything else is in __all__.
    # dir() also lists the asyncio names, which are imported at first use.
    public = {
        name
        for name in dir(hybridlock)
        if not name.startswith("_") and not isinstance(getattr(hybridlock, name), types.ModuleType)
    }
    assert public == set(hybridlock.__all__) - {"__version__"}
    assert isinstance(hybridlock.__version__, str)


def test_a_key_may_not_empty_the_cluster_hash_tag():
    registry = hybridlock.LocalLockRegistry()
    for key in ("}", "}x", "}orders:42"):
        with pytest.raises(hybridlock.InvalidArgumentError, match="hash tag"):
            registry.obtain(key)
    assert registry.obtain("orders:{42}").key == "orders:{42}"  # braces elsewhere are fine


def test_statistics_and_repr_show_the_state_without_a_round_trip():
    registry = hybridlock.LocalLockRegistry()
    lock = registry.obtain("stats")
    before = lock.statistics()
    assert before.owner_thread is None
    assert not before.holds_server_lease
    with lock, lock:
        stats = lock.statistics()
        assert stats.hold_count == 2
        assert stats.holds_server_lease
        assert stats.fencing_token == lock.fencing_token
        assert "count=2" in repr(lock)
    with pytest.raises(AttributeError):
        stats.hold_count = 5  # type: ignore[misc]  # frozen
