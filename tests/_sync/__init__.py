"""The behavioural suite over the thread API, GENERATED from ``tests/_async`` by ``scripts/unasync.py`` (only this
file and ``_compat.py`` are hand-written): the same tests, with threads where the async source has tasks.
"""
