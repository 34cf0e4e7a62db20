"""Release notifications over Redis pub/sub for ``RedisBackend``: ``Subscriber``.

Generated into ``hybridlock/_sync/backends/pubsub.py`` from ``hybridlock/_async/backends/pubsub.py`` (read how it
works there). This name *is* that module, not a copy of its names: whoever adjusts one of its settings here (tests
shorten ``_IDLE_UNSUBSCRIBE``) changes what the listener reads.
"""

from __future__ import annotations

import sys

from .._sync.backends import pubsub as _pubsub
from .._sync.backends.pubsub import Subscriber

__all__ = ["Subscriber"]

sys.modules[__name__] = _pubsub
