"""Several sittings of scripts/benchmark_engines.py side by side, each cell judged by its worst.

    python scripts/engine_sittings.py engines_s1.json engines_s2.json engines_s3.json

Prints two Markdown tables: every cell (precision, beam, batch, threads) with ours / CTranslate2
sent/s and their ratio in each sitting, then the worst ratio; and the best-thread table, where
each engine takes its faster thread count per sitting (precision, beam, batch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def speed_rows(path: Path) -> list[dict]:
    return [r for r in json.loads(path.read_text(encoding="utf-8"))["rows"]
            if r["kind"] == "speed"]


def table_head(first: str, sittings: int) -> list[str]:
    columns = " | ".join(f"sitting {i + 1}" for i in range(sittings))
    return [f"| {first} | {columns} | worst ratio |", "|---|" + "---|" * (sittings + 1)]


def cell_table(sittings: list[list[dict]]) -> list[str]:
    keys = sorted({(r["precision"], r["beam"], r["batch"], r["threads"])
                   for rows in sittings for r in rows})
    lines = table_head("precision, beam, batch, threads", len(sittings))
    for key in keys:
        cells, ratios = [], []
        for rows in sittings:
            row = next((r for r in rows if (r["precision"], r["beam"], r["batch"],
                                            r["threads"]) == key), None)
            if row is None:
                cells.append("")
                continue
            ratios.append(row["ours_vs_ctranslate2"])
            cells.append(f"{row['ours_sent_per_s']} / {row['ctranslate2_sent_per_s']} "
                         f"({row['ours_vs_ctranslate2']})")
        lines.append(f"| {key[0]} {key[1]} {key[2]}, {key[3]} | " + " | ".join(cells)
                     + f" | {min(ratios)} |")
    return lines


def best_thread_rows(rows: list[dict]) -> dict[tuple, tuple[float, int, float, int]]:
    """(precision, beam, batch) -> (ours best, its threads, CTranslate2 best, its threads)."""
    best: dict[tuple, tuple[float, int, float, int]] = {}
    for r in rows:
        key = (r["precision"], r["beam"], r["batch"])
        ours, ot, theirs, tt = best.get(key, (0.0, 0, 0.0, 0))
        if r["ours_sent_per_s"] > ours:
            ours, ot = r["ours_sent_per_s"], r["threads"]
        if r["ctranslate2_sent_per_s"] > theirs:
            theirs, tt = r["ctranslate2_sent_per_s"], r["threads"]
        best[key] = (ours, ot, theirs, tt)
    return best


def best_thread_table(sittings: list[list[dict]]) -> list[str]:
    per_sitting = [best_thread_rows(rows) for rows in sittings]
    keys = sorted({k for best in per_sitting for k in best})
    lines = table_head("precision, beam, batch", len(sittings))
    for key in keys:
        cells, ratios = [], []
        for best in per_sitting:
            if key not in best:
                cells.append("")
                continue
            ours, ot, theirs, tt = best[key]
            ratios.append(round(ours / theirs, 2))
            cells.append(f"{ours} ({ot}t) / {theirs} ({tt}t) ({ratios[-1]})")
        lines.append(f"| {key[0]} {key[1]} {key[2]} | " + " | ".join(cells)
                     + f" | {min(ratios)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sittings", type=Path, nargs="+", help="benchmark_engines.py --json files")
    args = parser.parse_args()
    sittings = [speed_rows(path) for path in args.sittings]
    print("\n".join(cell_table(sittings)))
    print()
    print("\n".join(best_thread_table(sittings)))


if __name__ == "__main__":
    main()
