"""hybridlock's benchmark suite: the same workloads, in one run, on one server started for the purpose, against
hybridlock and the Python lock libraries people use today. Run ``python -m benchmarks.run`` (see
benchmarks/README.md)."""
