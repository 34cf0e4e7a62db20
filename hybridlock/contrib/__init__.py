"""Framework integrations, each a leaf over hybridlock's public API behind its own extra: ``hybridlock.contrib.celery``
(``hybridlock[celery]``), ``hybridlock.contrib.django`` (``hybridlock[django]``) and ``hybridlock.contrib.fastapi``
(``hybridlock[fastapi]``). Nothing here is imported by ``import hybridlock``."""
