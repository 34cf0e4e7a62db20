"""The behavioural suite, written once for asyncio: ``scripts/unasync.py`` generates ``tests/_sync`` from it.

Concurrency here is tasks (``_compat.py``: ``run_concurrently``, ``spawn``); in the generated twin the same lines run
threads. Tests are ``async def`` and run in a loop of their own (``tests/conftest.py``'s ``pytest_pyfunc_call``).
"""
