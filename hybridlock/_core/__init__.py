"""The pure core: decisions and arithmetic with no threads, event loop, clock reads or I/O (docs/development.md)."""
