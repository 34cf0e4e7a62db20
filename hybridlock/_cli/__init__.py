"""The command line (`python -m hybridlock`): today the demo."""
