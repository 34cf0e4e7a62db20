"""The asyncio side: the source of truth for everything in hybridlock that waits or does I/O.

Every module here except the hand-written ``_compat.py`` shim (and this file) is rewritten by
``scripts/unasync.py`` into ``hybridlock/_sync/``; edit here, then run the script.
"""
