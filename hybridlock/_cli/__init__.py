"""The command line (``hybridlock``, or ``python -m hybridlock``): ``run`` (a distributed flock), ``inspect``,
``list``, ``release --force``, the ``demo`` and ``server`` (a throw-away server for a first try)."""
