"""Quorum locks over independent servers: the arithmetic and every decision, pure (no I/O, no clock reads).

A quorum lock is held in N independent Redis/Valkey servers (no replication between them). An owner holds it
while a *majority* (``N // 2 + 1``) of them hold its lease: two majorities of one N always share a server, and a
server gives a key to one owner at a time, so two owners never both hold a majority while their leases run. The
backend (``hybridlock._async.backends.quorum``) does the I/O, in parallel on every server; this module decides
what the replies mean, so that the decisions the backend takes are the ones the model in
``tests/test_quorum_model.py`` checks.

Validity
--------
A lease of ``L`` seconds is sent to every server at once, at ``start``. When the replies are in, ``elapsed``
seconds later, it is still certainly held for ``L - elapsed - drift`` seconds (``validity_left``), where
``drift = 1 % of L + 2 ms`` (``config.lease_drift``: the servers' clocks may run a little faster than ours, and
a server counts the lease from when it ran the script, not from ``start``). If that is not positive the attempt
failed even with a majority, and what it took is given back. The lock's ``valid_until`` is ``start + L - drift``,
the same deadline counted from before the requests left, ``start`` being that of the *granting* round: the waiting
loop reads the clock just before it sends each attempt (``waiting.Grant.sent_at``), no later than the round's own
``start``. Never the start of ``acquire``, which the local wait and refused rounds may precede by more than a lease.
(The backend's own deadline for the round's holders, below, counts from the round's ``start``: never before the
lock's.) A renewal is the same computation: a lease is extended only if a majority renews it and the replies come
back while the renewed lease is still valid.

A server that fails while we hold the lock (crashed, cut off, hanging) does not take the lock from us at once.
The servers of the last majority that granted or renewed our lease (the *holders*) keep it until that round's
deadline, whether they answer or not: a live server's key lasts until then, and a crashed one rejoins only after
the longest lease (the delayed-restart rule below). So a round in which the yes-sayers and the silent holders
together are a majority (``tally_flags``: ``covered``) leaves the lease ours until that deadline, not extended;
a release in that state reports the lease held throughout. Without that, acquiring on a bare majority and losing
one of its servers would report a lock lost that nobody else could have taken. A holder that answers *no* counts
for nothing: our key is gone there (evicted, deleted), and the lock is lost unless a majority says yes.

Fencing tokens across the quorum
--------------------------------
Each server mints ``max(counter + 1, its clock in µs)`` for a key when it grants it, and stores that in the key's
counter (``scripts.mint``). That alone is not enough across a quorum: two majorities share a server, but the
shared one may not be the server that minted the largest token, so a later majority can mint below an earlier
token (one server's clock running ahead is all it takes). So an acquire does two things before it returns:

1. it takes ``T = max`` of the tokens its granting majority ``G`` minted (``tally_acquire``);
2. it raises the key's counter to ``T`` on the servers of ``G`` that minted less (``RAISE_FENCE``: the
   *write-back*), and succeeds only if the servers of ``G`` now holding ``T`` (those that minted it plus those
   that confirmed the write-back) are a majority ``W``, and the lease is still valid after the write-back
   (``validity_left`` over the whole attempt). Otherwise the attempt fails and what it took is given back.

Claim: the token of every later acquisition (one that returns after this one) is greater than ``T``. Its granting
majority ``M'`` shares a server ``s`` with ``W`` (two majorities). ``s`` is in ``G``: it holds our lease from its
grant until we release it (after acquire returned) or the lease ends (after acquire returned too, since the
validity check covered the write-back), and grants nobody else meanwhile. So ``s`` grants the later acquisition
only after our write-back reached it, when its counter is at least ``T``, and mints at least ``T + 1``; the later
acquisition takes the maximum over ``M'``, which is at least that. Tokens therefore strictly increase in the
order acquisitions return, whichever majorities grant them, with any clock skew between the servers and with a
minority of servers down or cut off at any moment. (Only ``G`` may count: a server that refused us could grant
someone else just before a write-back lands there.) A counter that expired (``fence_retention`` after its last
acquisition or write-back: a week by default, at least the lease) is lost on every server at once; it is harmless
once more than twice the clock skew has passed since the last token was minted (see "Lost counters"), as the
delayed-restart rule asks of a server that lost its data.

Lost counters
-------------
A key's counter can also go on one server while the server stays up: deleted by a lock user, evicted
(``allkeys-*`` policies, and ``volatile-*`` ones too: counters carry a TTL), or overwritten with something that is
not a number. That server then mints from its clock alone, which may be behind ``T`` by up to twice the clock skew
(``T`` may come from a server whose clock runs ahead). The claim above rests on ``s``'s counter, so it no longer
covers a later majority that meets ``W`` only in such a server: nothing it can see is at least ``T`` (for
instance ``W = {A, B}`` with ``A``'s clock 10 s ahead, ``C`` refusing, ``B``'s counter deleted, ``A`` down, then
a round on ``{B, C}``).

What covers lost counters is redundancy, so the write-back goes to every server that answered the acquire round:
the granting servers that minted less (counted, as above) and, best effort and never counted (for the reason
above), the servers that refused. Call the servers that stored ``T`` (minted it, or took it from the write-back)
and have not lost the counter since its *keepers*.

Claim: an acquisition whose round starts after ``T``'s acquire returned mints above ``T`` if the servers that are
not keepers of ``T`` at some moment before that round's last mint are fewer than a majority: its granting majority
then contains a server that kept a counter of at least ``T`` until it minted there, which mints ``T + 1`` or more.
Those non-keepers are the servers ``T``'s write-back missed (down, cut off, or slower than the fan-out's patience
in either round) plus those that lost the counter since, counted even when a later write-back restored it. (A
round that overlaps ``T``'s write-back has only ``W``, as in the claim above, minus its lost counters.) Two more
facts narrow it: a lost counter is harmless once its server's clock has passed ``T`` (it re-seeds above ``T``
when more than twice the skew has passed since ``T`` was minted), and the write-back of every acquisition that
reaches such a server restores the counter there (the next ``T`` starts afresh).

So when every server answers (the usual case), tokens survive a lost counter on fewer than a majority of the
servers: one of 3, two of 5. What stays outside: counters lost on servers that, with the servers the last
write-back missed, make up a majority, within twice the skew of that token. With ``N = 3``: ``C`` down while ``X``
acquires on ``{A, B}``, ``B``'s counter deleted, then a round on ``{B, C}`` (``A`` down or slow) gives a lower
token; no server of that round ever kept ``T``. Refusing to mint there is not possible either: a round cannot tell
a lost counter from one its server never had (a new key, or one whose acquisitions that server missed), so a rule
that refused rounds with a missing counter would refuse every new key while one server is down, and would also
refuse the covered case above (``C`` keeps ``T``) without being able to tell it from this one. Detecting a loss
needs a record that outlives it, and any key the lock users may delete or the server may evict is not one.
``tests/_async/test_quorum_fencing.py`` shows the covered case on real servers (one clock 10 s ahead);
``tests/test_quorum_model.py`` loses counters within the bound, and finds a token going back beyond it.

Restarts without persistence
----------------------------
A server that restarts empty has lost its counters and its leases; the claim above used ``s``'s counter, and
exclusion used its lease. Both are restored by the **delayed-restart rule**: *a restarted server must not rejoin
(accept connections from lock clients) until the longest lease in use, and more than twice the clock skew, have
passed since it went down.*

* Exclusion: every lease it held had ended by then, so counting it again gives nobody a second majority.
* Tokens (the clock floor): a restarted server mints ``max(1, its clock)``. Every token minted up to a time
  ``t`` is at most ``t + skew + 1`` µs, where ``skew`` bounds how far any server's clock is from real time,
  ahead or behind:
  a mint is ``max(counter + 1, clock)``, every counter came from an earlier mint or write-back, and acquisitions
  on one server are more than a microsecond apart (each is a script run plus a round trip). A server that went
  down at ``t_down`` and rejoins at ``t_down + D`` reads a clock of at least ``t_down + D - skew``, which is above
  every token minted before it went down when ``D > 2 * skew + 1 µs``. With ``D`` at least the longest lease
  (0.1 s or more) and clocks kept within milliseconds by NTP this holds with a wide margin; a skew of half the
  lease or more needs a longer ``D`` (``tests/_async/test_quorum_fencing.py``: 0.3 s of skew under a 1.3 s delay
  keeps tokens higher, 3 s sends them back). Tokens minted while it was down came from majorities without it,
  whose write-backs the claim above covers.

What the rule asks of operators: keep a server that lost its data out, after it stopped, for at least the longest
lease any client may hold there: the largest ``expire_after`` of the registries using these servers (or passed
to ``renew(expire_after=...)``), and more than twice the clock skew. ``max_hold`` does not shorten it: it only
stops the renewals, and the lease the last renewal set still runs a whole ``expire_after`` in the server. Or run
the servers with persistence (``appendfsync always``). ``tests/test_quorum_model.py`` checks both properties over
crashes, restarts, partitions, clock skew, lost counters and expiring leases, and that dropping the write-back,
the rule, or the bound on lost counters breaks them.

What is not claimed: exclusion or token order when a server that lost its data rejoins early; token order when lost
counters exceed the bound under "Lost counters"; safety when a holder is paused past its lease (no lock can
prevent that; fencing tokens let the resource refuse it).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .config import lease_drift
from .results import AcquireResult

__all__ = [
    "QuorumAcquire",
    "QuorumVerdict",
    "majority",
    "tally_acquire",
    "tally_flags",
    "validity_left",
    "write_back_holds",
]


def majority(servers: int) -> int:
    """How many of ``servers`` servers make a majority: ``servers // 2 + 1``."""
    return servers // 2 + 1


def validity_left(lease: float, elapsed: float) -> float:
    """Seconds a lease of ``lease`` seconds, sent ``elapsed`` seconds ago, is still certainly held: lease minus
    elapsed minus the clock drift margin (``lease_drift``: 1 % of the lease plus 2 ms)."""
    return lease - elapsed - lease_drift(lease)


@dataclass(frozen=True)
class QuorumAcquire:
    """What one round of acquire replies (one per server; None for a server that failed) means.

    ``acquired``: a majority granted and the lease is still valid; ``token`` is then ``T`` (the largest token the
    granting servers minted), ``write_back`` the granting servers whose counter must be raised to ``T`` (they
    count toward ``write_back_holds``), ``already_at_token`` how many granting servers hold ``T`` already, and
    ``also_raise`` the servers that answered but refused: their counter is raised too, best effort, never
    counted (see "Lost counters" in the module docstring). ``granted``: every server that granted (given back
    when the attempt fails). ``reachable``: how many servers answered at all; below a majority the attempt could
    not have succeeded and the caller reports the servers unreachable. ``holder_ttl``: when refused, the soonest
    end of another owner's lease among the refusals (None: unknown)."""

    acquired: bool
    reachable: int
    granted: tuple[int, ...] = ()
    token: int | None = None
    write_back: tuple[int, ...] = ()
    already_at_token: int = 0
    holder_ttl: float | None = None
    contended: bool = False
    also_raise: tuple[int, ...] = ()


def tally_acquire(replies: Sequence[AcquireResult | None], lease: float, elapsed: float) -> QuorumAcquire:
    """Decide an acquire round: ``replies[i]`` is server ``i``'s answer (None when it failed), the lease was
    ``lease`` seconds and the replies were all in ``elapsed`` seconds after the requests left."""
    need = majority(len(replies))
    answered = [i for i, reply in enumerate(replies) if reply is not None]
    granted = tuple(i for i in answered if replies[i].acquired)  # type: ignore[union-attr]
    if len(granted) < need or validity_left(lease, elapsed) <= 0:
        ttls = [
            reply.holder_ttl
            for reply in replies
            if reply is not None and not reply.acquired and reply.holder_ttl is not None
        ]
        return QuorumAcquire(False, len(answered), granted, holder_ttl=min(ttls) if ttls else None)
    tokens = {i: replies[i].fencing_token for i in granted}  # type: ignore[union-attr]
    token = max(t for t in tokens.values() if t is not None)
    already = sum(1 for t in tokens.values() if t == token)
    # NOTE: only granting servers count for the write-back. Each keeps our lease until we release it or it ends,
    # both after this acquire returns, so no other owner can be granted there before the raised counter is in
    # place. A refusing server could grant someone else just before our write-back lands there (the model in
    # tests/test_quorum_model.py finds that interleaving when refusers are counted).
    write_back = tuple(i for i in granted if tokens[i] != token)
    contended = any(replies[i].contended for i in granted)  # type: ignore[union-attr]
    refused = tuple(i for i in answered if i not in tokens)
    return QuorumAcquire(True, len(answered), granted, token, write_back, already, None, contended, refused)


def write_back_holds(servers: int, already_at_token: int, raised: int) -> bool:
    """Whether a majority of ``servers`` now holds the token in its counter: those that minted it plus those whose
    counter the write-back raised."""
    return already_at_token + raised >= majority(servers)


@dataclass(frozen=True)
class QuorumVerdict:
    """What one round of yes/no replies (renewal, release) means for one lock.

    ``held``: a majority said yes. ``covered``: the servers that said yes, with the servers of the last majority
    that granted or renewed the lease (``holders``) that did not answer, are a majority; until that majority's
    deadline nobody else can hold a majority, so the lease is still ours until then, though not extended.
    ``decided``: at least a majority answered; a round that is neither covered nor decided says nothing (the caller
    reports the servers unreachable)."""

    held: bool
    reachable: int
    decided: bool
    covered: bool = False


def tally_flags(flags: Sequence[bool | None], holders: Collection[int] = ()) -> QuorumVerdict:
    """Decide one lock's renewal or release from ``flags[i]``: server ``i`` said yes (True), no (False) or failed
    (None); ``holders`` are the servers that granted the lease or renewed it in the last round a majority did.

    A silent server of ``holders`` still counts toward ``covered``: it kept our lease up to that round's deadline
    (a key is only lost early by eviction or deletion, and a server that went down rejoins, under the
    delayed-restart rule, only after the longest lease), so it grants nobody else before then. A server that said
    no never counts, even in ``holders``: our key is gone there, and it may already be someone else's. Servers that
    never held our lease (they refused the acquire) count only by saying yes."""
    answered = [flag for flag in flags if flag is not None]
    need = majority(len(flags))
    yes = sum(answered)
    silent_holders = sum(1 for index in holders if flags[index] is None)
    return QuorumVerdict(yes >= need, len(answered), len(answered) >= need, yes + silent_holders >= need)
