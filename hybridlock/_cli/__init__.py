"""The command line (``hybridlock``, or ``python -m hybridlock``): ``run`` (a distributed flock), ``inspect``,
``list``, ``release --force`` and the ``demo``."""
