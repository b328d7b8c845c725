"""The fault and chaos harness the tests use, each part also runnable as a program for the
full sweeps (``python -m tests.harness.faults``, ``python -m tests.harness.chaos``:
docs/faults.md)."""
