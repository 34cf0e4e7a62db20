"""The lock servers behind one narrow interface (``base.AsyncLockBackend``), written once for asyncio: in memory
(``memory``), one Redis/Valkey server (``redis``) and its release notifications (``pubsub``), and a cluster
(``cluster``, with the client plumbing each side spells its own way in ``_compat``).

The public import paths are ``hybridlock.backends`` and its modules; these are the implementations.
"""
