"""An engine for the engine benchmark's isolation tests: echoes its input, loads nothing."""

from __future__ import annotations


class EchoEngine:
    def __init__(self, spec: dict):
        self.spec = spec

    def run(self, lines: list[str], beam: int) -> list[str]:
        return [line.upper() for line in lines]
