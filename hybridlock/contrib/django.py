"""Django: a registry configured from ``settings.HYBRIDLOCK``, one per process, and management commands that never
overlap themselves (``hybridlock[django]``; guide: docs/django.md).

::

    # settings.py
    HYBRIDLOCK = {
        "URL": "redis://localhost:6379/0",  # or redis+sentinel://..., redis+cluster://...; or "QUORUM": [url, ...]
        "OPTIONS": {"registry_key": "myapp", "expire_after": 30},  # LockRegistry's keyword arguments
    }

    # anywhere
    from hybridlock.contrib.django import get_registry

    with get_registry().obtain("orders:42"):
        ...

The registry is built at its first use in each process and closed when the process exits. A registry built before a
fork (``gunicorn --preload``, uWSGI without ``lazy-apps``, ``multiprocessing`` with ``fork``) is never used by the
child: the child's first call builds its own, with its own owner identity and threads. A setting that is wrong
raises ``django.core.exceptions.ImproperlyConfigured`` at that first use, naming the setting (never a password).

``LockedCommand`` is a mixin for management commands: a run takes the command's lock first and, while another run
holds it, exits with a message and status 75 (or waits ``--lock-timeout`` seconds for it).

This module imports only hybridlock's public API and Django; ``import hybridlock`` never imports it.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.core.signals import setting_changed

import hybridlock
from hybridlock.backends.clients import redacted, redacted_url
from hybridlock.errors import InvalidArgumentError
from hybridlock.templates import acquire_timeout

__all__ = [
    "EXIT_FAILED",
    "EXIT_HELD",
    "EXIT_LOST",
    "EXIT_TIMEOUT",
    "LockedCommand",
    "close_registry",
    "get_registry",
]

logger = logging.getLogger("hybridlock.django")

SETTING = "HYBRIDLOCK"

#: The exit statuses of a ``LockedCommand`` run that did not do its work, as ``hybridlock run`` numbers them
#: (docs/command-line.md): another run holds the lock (sysexits' ``EX_TEMPFAIL``: try again later) ...
EXIT_HELD = 75
#: ... the lease was lost while the command ran (another run may have started meanwhile) ...
EXIT_LOST = 122
#: ... ``--lock-timeout`` passed while another run held the lock (as ``timeout(1)``) ...
EXIT_TIMEOUT = 124
#: ... the lock server could not be reached or refused.
EXIT_FAILED = 125

_TOP_LEVEL = ("URL", "QUORUM", "OPTIONS")


# -- the registry --------------------------------------------------------------------------------------------------

# This process's registry and the pid that built it. A forked child sees its parent's pid here (and its parent's
# registry, which the core has reset to a fresh owner with no threads): it puts that one aside and builds its own.
_guard = threading.Lock()
_registry: hybridlock.LockRegistry | None = None
_owner_pid = 0
# Registries inherited through a fork, closed in the child at its next get_registry() or close_registry().
_inherited: list[hybridlock.LockRegistry] = []


def get_registry() -> hybridlock.LockRegistry:
    """This process's registry, built from ``settings.HYBRIDLOCK`` at the first call in the process (a
    ``QuorumLockRegistry`` when the setting lists ``QUORUM`` servers). Thread-safe; one per process: after a fork
    the child builds its own at its first call. Closed at exit (``close_registry``), and when a test changes the
    setting (``override_settings``).

    Raises ``ImproperlyConfigured`` for a missing or wrong setting (see docs/django.md); the server is first
    contacted by the first lock taken, which raises hybridlock's errors (``BackendUnavailableError``, ...)."""
    registry = _registry
    if registry is not None and _owner_pid == os.getpid():
        return registry
    with _guard:
        _adopt_fork()
        if _registry is None:
            _build()
        assert _registry is not None
        return _registry


def close_registry() -> None:
    """Close this process's registry, if it was built (the next ``get_registry()`` builds a new one). Runs at exit;
    call it yourself where a process ends without running ``atexit`` handlers. Closing does not release locks still
    held (see ``LockRegistry.close``)."""
    global _registry
    with _guard:
        _adopt_fork()
        registry, _registry = _registry, None
    if registry is not None:
        registry.close()


def _adopt_fork() -> None:
    """(Under ``_guard``.) In a forked child, set the parent's registry aside and close it: the child never uses
    it. The core reset it at the fork (no leases, no threads, connections not shared), so closing it sends
    nothing on the parent's connections."""
    global _registry
    if _registry is not None and _owner_pid != os.getpid():
        _inherited.append(_registry)
        _registry = None
    while _inherited:
        inherited = _inherited.pop()
        try:
            inherited.close()
        except Exception:  # the child's own registry matters, not the parent's leftovers
            logger.debug("hybridlock: could not close a registry inherited through a fork", exc_info=True)


def _build() -> None:
    global _registry, _owner_pid
    _registry = registry_from_settings(getattr(settings, SETTING, None))
    _owner_pid = os.getpid()


def _after_fork_in_child() -> None:
    # Another thread may have held the guard at the fork: the child's copy would stay locked for ever.
    global _guard
    _guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_at_exit() -> None:
    # (The child of a fork runs its parent's atexit handlers too: close_registry closes the child's own.)
    try:
        close_registry()
    except Exception:  # at exit there is nobody left to raise to
        logger.debug("hybridlock: could not close the registry at exit", exc_info=True)


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    # override_settings(HYBRIDLOCK=...) in a test: the next get_registry() is built from the new value.
    if setting == SETTING:
        close_registry()


setting_changed.connect(_on_setting_changed, dispatch_uid="hybridlock.contrib.django.setting_changed")


def registry_from_settings(value: Any) -> hybridlock.LockRegistry:
    """A new registry from a ``HYBRIDLOCK`` setting's value (``get_registry()`` calls it once per process; call it
    yourself for a registry of your own lifetime, as a test may). ``ImproperlyConfigured`` names what is wrong."""
    where = f"settings.{SETTING}"
    if value is None:
        raise ImproperlyConfigured(
            f"{where} is not set: give the lock server, e.g. {SETTING} = {{'URL': 'redis://localhost:6379/0'}} (or "
            "'QUORUM': [url, url, url]), and registry options in 'OPTIONS'"
        )
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{where} must be a dict, not {type(value).__name__}")
    unknown = sorted(str(name) for name in value if name not in _TOP_LEVEL)
    if unknown:
        raise ImproperlyConfigured(
            f"{where} has unknown keys {', '.join(map(repr, unknown))}: it takes {', '.join(map(repr, _TOP_LEVEL))}"
        )
    if ("URL" in value) == ("QUORUM" in value):
        raise ImproperlyConfigured(
            f"{where} needs exactly one of 'URL' (one server, Sentinel or Cluster) and 'QUORUM' (a list of "
            "independent servers' URLs)"
        )
    options = value.get("OPTIONS", {})
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"{where}['OPTIONS'] must be a dict, not {type(options).__name__}")
    if "URL" in value:
        url = value["URL"]
        if not isinstance(url, str) or not url:
            raise ImproperlyConfigured(f"{where}['URL'] must be a non-empty string (redis://, rediss://, unix://, ...)")
        urls = [url]
        cls: type[hybridlock.LockRegistry] = hybridlock.LockRegistry
        server: Any = url
    else:
        urls = value["QUORUM"]
        if isinstance(urls, str) or not isinstance(urls, list | tuple) or not all(isinstance(u, str) for u in urls):
            raise ImproperlyConfigured(f"{where}['QUORUM'] must be a list of URLs, one per independent server")
        cls, server = hybridlock.QuorumLockRegistry, list(urls)
    accepted = [name for name in list(inspect.signature(cls.__init__).parameters)[2:] if name not in ("args", "kwargs")]
    wrong = sorted(str(name) for name in options if name not in accepted)
    if wrong:
        raise ImproperlyConfigured(
            f"{where}['OPTIONS'] has unknown options {', '.join(map(repr, wrong))}: {cls.__name__} takes "
            f"{', '.join(accepted)}"
        )
    try:
        return cls(server, **options)
    except (hybridlock.HybridLockError, TypeError, ValueError) as exc:
        detail = str(exc)
        for url in urls:
            detail = redacted(detail, url)
        shown = ", ".join(redacted_url(url) for url in urls)
        # (Not chained: the cause's message may quote the URL as given, password included.)
        raise ImproperlyConfigured(f"{where} ({shown}) is not a valid {cls.__name__} setting: {detail}") from None


# -- management commands -------------------------------------------------------------------------------------------


class LockedCommand:
    """A mixin for management commands that must never run twice at once (a command cron starts every few
    minutes, on one host or several): ``class Command(LockedCommand, BaseCommand)``.

    Each run takes the lock ``lock_key`` (default ``"django:command:<name>"``, the command's module name) from
    ``get_registry()`` before ``handle()``, holds it (renewed) while ``handle()`` runs and releases it however
    ``handle()`` ends. While another run, in any process on any host sharing the lock server, holds it, this run
    does not start: it raises ``CommandError`` with status ``EXIT_HELD`` (75), or, given ``lock_timeout``
    seconds, waits that long first (``EXIT_TIMEOUT``, 124, once they pass; -1 waits as long as it takes).
    ``manage.py`` prints ``CommandError: <message>`` and exits with that status; ``call_command`` raises it.

    Two options are added to the command line: ``--lock-key KEY`` and ``--lock-timeout SECONDS`` (``call_command(...,
    lock_key=..., lock_timeout=...)``), defaulting to the class attributes. While ``handle()`` runs,
    ``self.command_lock`` is the held lock (its ``fencing_token``, ``ensure_held()``, ``until_lost()``). A lease
    lost while ``handle()`` ran (the server unreachable past the lease, the key deleted) means another run may have
    started beside this one: a run that otherwise succeeded then ends with ``EXIT_LOST`` (122); the server not
    reachable at the start, with ``EXIT_FAILED`` (125).
    """

    #: The lock's key; None: ``"django:command:<name>"``.
    lock_key: str | None = None
    #: Seconds to wait for another run to finish: 0 (default) does not wait; -1 waits as long as it takes.
    lock_timeout: float = 0
    #: The lock while ``handle()`` runs (None otherwise).
    command_lock: hybridlock.HybridLock | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # What every run would be refused for is refused where the command is declared: when its module is
        # imported, not at each run.
        super().__init_subclass__(**kwargs)
        if cls.lock_key is not None and not isinstance(cls.lock_key, str):
            raise InvalidArgumentError(f"{cls.__qualname__}.lock_key must be None or a str, not {cls.lock_key!r}")
        try:
            if cls.lock_timeout is None:  # (None is no timeout acquire takes; -1 waits as long as it takes)
                raise InvalidArgumentError("timeout must be a number of seconds, not None")
            acquire_timeout(cls.lock_timeout)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{cls.__qualname__}.lock_timeout: {exc}") from None

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # manage.py and call_command both name the command here (a class defined in a script has no module to be
        # named after).
        self._command_name = subcommand or None
        parser: CommandParser = super().create_parser(prog_name, subcommand, **kwargs)  # type: ignore[misc]
        parser.add_argument(
            "--lock-key",
            metavar="KEY",
            default=None,
            help=f"the lock that keeps two runs apart (default: {self._default_key()!r})",
        )
        parser.add_argument(
            "--lock-timeout",
            metavar="SECONDS",
            type=float,
            default=None,
            help=f"how long to wait while another run holds the lock (default: {self.lock_timeout:g}; 0: do not "
            "wait, -1: as long as it takes)",
        )
        return parser

    def execute(self, *args: Any, **options: Any) -> Any:
        key = options.get("lock_key") or self._default_key()
        timeout = options.get("lock_timeout")
        timeout = self.lock_timeout if timeout is None else timeout
        registry = get_registry()
        lock = registry.obtain(key)
        self._acquire(lock, key, timeout, registry)
        self.command_lock = lock
        failed = True
        try:
            result = super().execute(*args, **options)  # type: ignore[misc]
            failed = False
            return result
        finally:
            self.command_lock = None
            try:
                lock.release()
            except hybridlock.LockLostError as exc:
                if not failed:
                    raise CommandError(
                        f"{self._name()}: the lease of {key!r} was lost while the command ran (on {exc.server}): "
                        "another run may have run beside it",
                        returncode=EXIT_LOST,
                    ) from exc
                # The command's own exception is what its caller must hear; the loss is logged beside it.
                logger.warning("%s: the lease of %r was lost while the command ran", self._name(), key)
            except hybridlock.HybridLockError as exc:
                # The release did not reach the server (out of reach, refused): the work is done (or its own
                # exception goes on), and the key ends with its lease, within expire_after. As `hybridlock run`
                # does, say so and keep the command's outcome.
                logger.warning("%s: %r could not be released (it ends with its lease): %s", self._name(), key, exc)

    def _acquire(self, lock: hybridlock.HybridLock, key: str, timeout: float, registry: Any) -> None:
        try:
            got = lock.acquire(blocking=False) if timeout == 0 else lock.acquire(timeout=timeout)
        except hybridlock.InvalidArgumentError as exc:
            raise CommandError(f"{self._name()}: {exc}") from exc
        except hybridlock.HybridLockError as exc:
            raise CommandError(f"{self._name()}: could not take {key!r}: {exc}", returncode=EXIT_FAILED) from exc
        if got:
            return
        quorum = isinstance(registry, hybridlock.QuorumLockRegistry)
        held = (
            "could not be taken on a majority of the servers (held by another run, or servers out of reach)"
            if quorum
            else "is held by another run"
        )
        who = f"hybridlock inspect {key} --registry-key {registry.registry_key} --server URL"
        if timeout == 0:
            raise CommandError(
                f"{self._name()} did not start: its lock {key!r} on {registry.server} {held}. Wait for it with "
                f"--lock-timeout SECONDS; see who holds it with: {who}",
                returncode=EXIT_HELD,
            )
        raise CommandError(
            f"{self._name()} did not start: timed out after {timeout:g} s waiting for its lock {key!r} on "
            f"{registry.server}, which {'could not be taken' if quorum else 'another run held'} all that time; see "
            f"who holds it with: {who}",
            returncode=EXIT_TIMEOUT,
        )

    def _name(self) -> str:
        return getattr(self, "_command_name", None) or type(self).__module__.rpartition(".")[2]

    def _default_key(self) -> str:
        return self.lock_key or f"django:command:{self._name()}"
