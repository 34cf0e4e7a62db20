"""The process between ``hybridlock run`` and its command, so that the command dies with the runner, however the
runner ends (``kill -9``, the OOM killer, a container runtime): a command left running after its runner is gone
works on without the lock, which nobody renews any more, so a second runner soon gets it.

``hybridlock run`` starts ``python -I -S keeper.py FD -- CMD [ARGS...]`` (this file, run by its path: it imports
the standard library only, so it starts fast and needs nothing of the environment); FD is the read end of a pipe
whose write end only the runner holds. The keeper starts CMD as its child, then:

* reads the pipe: each byte the runner writes is a signal to pass on to CMD (SIGKILL: to CMD and everything it
  started, as below). End of file means the runner is gone, by whatever death (the kernel closes a dead process's
  descriptors): the keeper then kills CMD and everything CMD started with SIGKILL, and exits;
* reaps its children, and exits with CMD's status once CMD has ended (128 + N when signal N ended it, as a shell
  reports it), leaving alone what CMD left running in the background.

Failure modes
-------------
* What CMD started (a shell's pipeline, a job put in the background, a process that daemonized): on Linux the
  keeper is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so an orphaned descendant of CMD becomes the keeper's
  child rather than init's, and killing everything is "SIGKILL every child, reap, again until no child is left"
  (a pid is only killed while it is our unreaped child, so never a reused one). Only a descendant that makes
  itself a subreaper, or enters another PID namespace, escapes. On other systems only CMD itself is killed.
* The runner died before CMD started: CMD is not started at all.
* The keeper itself is killed: on Linux CMD gets SIGKILL from the kernel (``PR_SET_PDEATHSIG``, set in the child
  before the exec and checked against a keeper that died already), not what CMD started; the runner then reports
  CMD as killed by SIGKILL and releases the lock.
* Signals: the keeper shares the runner's process group, so it ignores the signals the runner passes on (a Ctrl-C
  typed at the terminal reaches CMD directly, as it reaches the runner); CMD starts with them at their defaults.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import sys
import time

PROG = "hybridlock run"
# Signals the runner passes on through the pipe: the keeper itself ignores them (see the module's docstring).
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Python ignores these at start-up; CMD gets them at their defaults, as from subprocess (restore_signals).
_PYTHON_IGNORES = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LINUX = sys.platform.startswith("linux")
_EXEC_FAILED = 127  # the child's status when the exec failed (the keeper then reads why from the error pipe)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _start(command: list[str]) -> int:
    """Fork and exec ``command``: its pid. ``OSError`` (with the exec's errno) when it could not be run."""
    error_read, error_write = os.pipe()  # both close-on-exec: EOF once the exec succeeded
    keeper = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: nothing here may return into the keeper's code
        try:
            signal.set_wakeup_fd(-1)
            for signum in (*PASSED_ON, *_PYTHON_IGNORES, signal.SIGCHLD):
                signal.signal(signum, signal.SIG_DFL)
            if _LINUX:
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != keeper:  # the keeper died before prctl took effect: nobody would kill us
                    os._exit(128 + signal.SIGKILL)
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(error_write, (exc.errno or errno.ENOEXEC).to_bytes(4, "little"))
        finally:
            os._exit(_EXEC_FAILED)
    os.close(error_write)
    try:
        reply = b""
        while chunk := os.read(error_read, 4):
            reply += chunk
    finally:
        os.close(error_read)
    if reply:
        os.waitpid(pid, 0)
        number = int.from_bytes(reply[:4], "little")
        raise OSError(number, os.strerror(number))
    return pid


def _children() -> list[int]:
    """The keeper's children now (Linux: including every orphan CMD left, the keeper being their subreaper)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as listing:
            return [int(pid) for pid in listing.read().split()]
    except OSError:
        pass
    found = []  # a kernel without /proc/<pid>/task/<tid>/children: every process's parent, from its stat line
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()  # the name, in parentheses, may hold spaces
            except OSError:
                continue  # ended meanwhile
            if len(fields) > 1 and int(fields[1]) == me:
                found.append(int(entry))
    return found


class Keeper:
    def __init__(self, command_pid: int) -> None:
        self.command = command_pid
        self.status: int | None = None  # CMD's wait status once reaped

    def reap(self) -> bool:
        """Reap every child that has ended (CMD, and orphans of CMD's handed to the keeper): whether any is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.command:
                self.status = status

    def send(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            self.kill_everything()
        elif self.status is None:  # not reaped, so the pid is still CMD's
            try:
                os.kill(self.command, signum)
            except (ProcessLookupError, ValueError):
                pass

    def kill_everything(self) -> None:
        """SIGKILL CMD and everything it started (see the module's docstring), and reap them all."""
        if self.status is None:
            os.kill(self.command, signal.SIGKILL)
        while True:
            for pid in _children() if _LINUX else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not self.reap():
                return
            time.sleep(0.005)  # killed, not yet ended (or an orphan handed over since the listing)


def main(argv: list[str]) -> int:
    # First of all: a signal meant for CMD must not end the keeper (a Ctrl-C reaches the whole process group).
    for signum in PASSED_ON:
        signal.signal(signum, signal.SIG_IGN)
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(f"usage: {os.path.basename(__file__)} FD -- CMD [ARGS...]", file=sys.stderr)
        return 2
    control = int(argv[0])
    command = argv[2:]
    os.set_inheritable(control, False)
    if _LINUX:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    # A child's end writes to this pipe (SIGCHLD's handler), so that one select waits for it and for the runner.
    wake_read, wake_write = os.pipe()
    for end in (wake_read, wake_write):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    early = b""
    if select.select([control], [], [], 0)[0]:
        early = os.read(control, 64)  # signals the runner passed on before CMD started, or its end
        if not early:
            return 128 + signal.SIGKILL  # the runner is gone already, and its lease with it: CMD must not start
    try:
        keeper = Keeper(_start(command))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            print(f"{PROG}: {command[0]}: command not found ({exc.strerror})", file=sys.stderr)
            return 127  # as run.py's EXIT_NOT_FOUND (this file imports nothing of the package)
        print(f"{PROG}: {command[0]}: cannot run it ({exc.strerror})", file=sys.stderr)
        return 126  # EXIT_CANNOT_RUN
    for number in early:
        keeper.send(number)
    while keeper.status is None:
        ready = select.select([control, wake_read], [], [])[0]
        if wake_read in ready:
            try:
                while os.read(wake_read, 512):
                    pass
            except BlockingIOError:
                pass
        keeper.reap()
        if control in ready and keeper.status is None:
            signals = os.read(control, 64)
            if not signals:  # the runner is gone
                keeper.kill_everything()
                break
            for number in signals:
                keeper.send(number)
    status = os.waitstatus_to_exitcode(keeper.status) if keeper.status is not None else -signal.SIGKILL
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
