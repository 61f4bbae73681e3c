"""Named points where a test can kill the process as `kill -9` would, to prove resume is exact.

`NMT_FAILPOINT=name` (or `name:N`, the N-th time the point is reached) makes `hit(name)` end
the process at once with exit code 137 — no cleanup, no `finally`, exactly like SIGKILL. With
`=SIGTERM` or `=SIGINT` after it (`name:N=SIGTERM`) the process sends itself that signal instead,
as `kill` or Ctrl-C would at that moment, to test what a graceful stop keeps. Under torchrun
only rank 0 is hit, unless `@R` names another rank (`name:N@R`). Unset (always, outside tests)
it costs one dict lookup. The idea is the failpoints of etcd/TiKV.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

KILLED = 137  # 128 + SIGKILL, what a shell reports for `kill -9`
_hits: Counter[str] = Counter()


def hit(name: str) -> None:
    wanted = os.environ.get("NMT_FAILPOINT")
    if not wanted:
        return
    wanted, _, rank = wanted.partition("@")
    wanted, _, send = wanted.partition("=")
    point, _, nth = wanted.partition(":")
    if point != name or os.environ.get("RANK", "0") != (rank or "0"):
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        if send:
            os.kill(os.getpid(), signal.Signals[send])
        else:
            os._exit(KILLED)
