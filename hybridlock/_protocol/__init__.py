"""The wire protocol: every Lua script the backends run, each with its KEYS/ARGV/returns header."""
