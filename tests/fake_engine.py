"""An engine for the engine benchmark's isolation tests: echoes its input, loads nothing."""

from __future__ import annotations


class EchoEngine:
    def __init__(self, spec: dict):
        self.spec = spec

    def run(self, lines: list[str], beam: int) -> list[str]:
        return [line.upper() for line in lines]


class ClockedEngine:
    """Runs on a clock of its own: each call advances it 1 s per line, 3 s per line with
    scores (`scores`, set by the harness), so the score-cost pairing has exact answers."""

    def __init__(self, spec: dict):
        import time

        self.scores, self.now = False, 0.0
        time.perf_counter = lambda: self.now  # this worker process only

    def run(self, lines: list[str], beam: int) -> list[str]:
        self.now += len(lines) * (3.0 if self.scores else 1.0)
        return [line.upper() for line in lines]
