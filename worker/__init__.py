"""The bagpipe worker: pulls task messages, holds them by lease, runs stages, commits."""
