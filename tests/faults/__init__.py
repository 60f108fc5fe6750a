"""Faults and bad input: closed streams, signals, untrusted files, mistyped arguments.

One file per concern; the CLI runs as a real subprocess wherever the fault is a process's
(signals, closed file descriptors). docs/reliability.md lists which test holds which promise.
"""
