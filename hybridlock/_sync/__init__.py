"""The thread side: modules generated from ``hybridlock/_async/`` by ``scripts/unasync.py`` (do not edit them),
plus the hand-written ``_compat.py`` shim (and this file).
"""
