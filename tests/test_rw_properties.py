"""Property test: read-write admission across owners matches a simple model, whatever the order of operations.

Several registries on one in-memory backend are several owners. One thread drives them all with non-blocking
calls, so every step has a definite expected outcome; Hypothesis searches for a sequence where the lock admits
what the model refuses (or the reverse), or leaves anything behind.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hybridlock
from hybridlock.backends import MemoryBackend

OWNERS = 3


class ReadWriteAdmission(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        backend = MemoryBackend()
        self.registries = [hybridlock.LockRegistry(backend, auto_renew=False) for _ in range(OWNERS)]
        self.locks = [registry.obtain_read_write("doc") for registry in self.registries]
        self.reads = [0] * OWNERS  # the model: read depth and write depth of each owner (one thread each)
        self.writes = [0] * OWNERS

    def teardown(self) -> None:
        with warnings.catch_warnings():
            # A run may end with locks held: closing then warns, as it should.
            warnings.simplefilter("ignore", hybridlock.LocksHeldAtCloseWarning)
            for registry in self.registries:
                registry.close()

    @rule(owner=st.integers(0, OWNERS - 1))
    def try_read(self, owner: int) -> None:
        if self.reads[owner]:
            expected = True  # reentrant
        elif self.writes[owner]:
            expected = True  # downgrade
        else:
            expected = not any(self.writes[o] for o in range(OWNERS) if o != owner)
        assert self.locks[owner].read_lock().acquire(blocking=False) is expected
        if expected:
            self.reads[owner] += 1

    @rule(owner=st.integers(0, OWNERS - 1))
    def try_write(self, owner: int) -> None:
        if self.reads[owner] and not self.writes[owner]:
            with pytest.raises(hybridlock.LockUpgradeError):
                self.locks[owner].write_lock().acquire(blocking=False)
            return
        if self.writes[owner]:
            expected = True  # reentrant
        else:
            others = [o for o in range(OWNERS) if o != owner]
            expected = not any(self.writes[o] or self.reads[o] for o in others)
        assert self.locks[owner].write_lock().acquire(blocking=False) is expected
        if expected:
            self.writes[owner] += 1

    @precondition(lambda self: any(self.reads))
    @rule(data=st.data())
    def release_read(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from([o for o in range(OWNERS) if self.reads[o]]))
        self.locks[owner].read_lock().release()
        self.reads[owner] -= 1

    @precondition(lambda self: any(self.writes))
    @rule(data=st.data())
    def release_write(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from([o for o in range(OWNERS) if self.writes[o]]))
        self.locks[owner].write_lock().release()
        self.writes[owner] -= 1

    @rule(owner=st.integers(0, OWNERS - 1))
    def release_unheld_is_refused(self, owner: int) -> None:
        if not self.reads[owner]:
            with pytest.raises(hybridlock.LockNotOwnedError):
                self.locks[owner].read_lock().release()
        if not self.writes[owner]:
            with pytest.raises(hybridlock.LockNotOwnedError):
                self.locks[owner].write_lock().release()

    @invariant()
    def depths_match_the_model(self) -> None:
        for owner, rw in enumerate(self.locks):
            assert rw.read_lock().hold_count == self.reads[owner]
            assert rw.write_lock().hold_count == self.writes[owner]
        writers = [o for o in range(OWNERS) if self.writes[o]]
        assert len(writers) <= 1
        if writers:
            assert all(not self.reads[o] for o in range(OWNERS) if o != writers[0])


ReadWriteAdmission.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_read_write_admission = ReadWriteAdmission.TestCase


class PlainLockReentrancy(RuleBasedStateMachine):
    """Two owners, nested acquires and releases: depth, exclusion and fencing tokens follow the model."""

    def __init__(self) -> None:
        super().__init__()
        backend = MemoryBackend()
        self.registries = [hybridlock.LockRegistry(backend, auto_renew=False) for _ in range(2)]
        self.locks = [registry.obtain("k") for registry in self.registries]
        self.depth = [0, 0]
        self.last_token = 0

    def teardown(self) -> None:
        with warnings.catch_warnings():
            # A run may end with locks held: closing then warns, as it should.
            warnings.simplefilter("ignore", hybridlock.LocksHeldAtCloseWarning)
            for registry in self.registries:
                registry.close()

    @rule(owner=st.integers(0, 1))
    def try_acquire(self, owner: int) -> None:
        expected = self.depth[1 - owner] == 0
        assert self.locks[owner].acquire(blocking=False) is expected
        if expected:
            if self.depth[owner] == 0:  # a fresh tenancy mints a greater token
                token = self.locks[owner].fencing_token
                assert token is not None
                assert token > self.last_token
                self.last_token = token
            self.depth[owner] += 1

    @rule(owner=st.integers(0, 1))
    def release(self, owner: int) -> None:
        if self.depth[owner] == 0:
            with pytest.raises(hybridlock.LockNotOwnedError):
                self.locks[owner].release()
            return
        self.locks[owner].release()
        self.depth[owner] -= 1

    @invariant()
    def depths_match(self) -> None:
        for owner in (0, 1):
            assert self.locks[owner].hold_count == self.depth[owner]
        assert min(self.depth) == 0


PlainLockReentrancy.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_plain_lock_reentrancy = PlainLockReentrancy.TestCase
