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
    public = {name for name in dir(hybridlock) if not name.startswith("_")} - {"errors", "backends"}
    assert public <= set(hybridlock.__all__)
