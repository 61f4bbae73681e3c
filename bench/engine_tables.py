"""The tables of docs/engines.md, from the sittings of bench.engines_vs_ctranslate2: the
translation check, every cell per sitting, the best thread count and the cost of scores, each
cell judged by its worst sitting (`--merge`: one file of every sitting given).
"""

from __future__ import annotations

from pathlib import Path

import typer

from bench.common import cli_app, markdown_table, read_sittings, run_cli, span, write_json

COST_BOLD_BELOW = 0.97  # a cost of more than 3%

def rows_of(sitting: dict, kind: str) -> list[dict]:
    return [r for r in sitting["rows"] if r["kind"] == kind]


def speed_rows(sitting: dict) -> list[dict]:
    return rows_of(sitting, "speed")


def distinct(values) -> str:
    seen = list(dict.fromkeys(str(v) for v in values if v is not None))
    return ", ".join(seen)


def heading(sittings: list[dict]) -> list[str]:
    parts = []
    commits = distinct(s.get("commit") for s in sittings)
    if commits:
        parts.append(f"commit {commits}")
    machines = distinct(s.get("machine") for s in sittings)
    if machines:
        parts.append(machines)
    count = f"{len(sittings)} sitting{'s' if len(sittings) != 1 else ''}"
    return [f"{count}: {'; '.join(parts)}."] if parts else [f"{count}."]


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def quality_line(sittings: list[dict]) -> list[str]:
    """One line: each checked configuration's identical strings and BLEU, ours / CTranslate2
    (a range where the sittings differ)."""
    rows = [r for s in sittings for r in rows_of(s, "quality")]
    keys = list(dict.fromkeys((r["precision"], r["beam"], r["batch"]) for r in rows))
    if not keys:
        return []
    parts = []
    for key in keys:
        same = [r for r in rows if (r["precision"], r["beam"], r["batch"]) == key]
        parts.append(f"{key[0]} beam {key[1]} batch {key[2]}: "
                     f"{span([r['identical'] for r in same], percent)} identical, BLEU "
                     f"{span([r['bleu_ours'] for r in same])} / "
                     f"{span([r['bleu_ctranslate2'] for r in same])}")
    sentences = span([r["sentences"] for r in rows])
    return [f"Test split ({sentences} sentences), ours / CTranslate2: {'; '.join(parts)}."]


def label(key: tuple) -> str:
    """(precision, beam, batch[, threads]) -> 'int8 1 32[, 2]'."""
    return " ".join(map(str, key[:3])) + (f", {key[3]}" if len(key) > 3 else "")


def sittings_table(first: str, keys, sittings: list, cell, worst,
                   last: tuple = ("worst ratio",)) -> list[str]:
    """A row per key, a column per sitting: `cell(sitting, key)` is (its text, its figure), or
    None where the sitting lacks the key; then `worst(figures)`, the last columns."""
    lines = markdown_table([first, *(f"sitting {i + 1}" for i in range(len(sittings))), *last],
                           [])
    for key in keys:
        found = [cell(sitting, key) for sitting in sittings]
        figures = [f[1] for f in found if f is not None]
        if figures:
            lines.append(f"| {label(key)} | " + " | ".join(f[0] if f else "" for f in found)
                         + f" | {worst(figures)} |")
    return lines


def cell_key(r: dict) -> tuple:
    return r["precision"], r["beam"], r["batch"], r["threads"]


def cell_table(sittings: list[list[dict]]) -> list[str]:
    def cell(rows: list[dict], key: tuple):
        row = next((r for r in rows if cell_key(r) == key), None)
        return row and (f"{row['ours_sent_per_s']} / {row['ctranslate2_sent_per_s']} "
                        f"({row['ours_vs_ctranslate2']})", row["ours_vs_ctranslate2"])

    return sittings_table("precision, beam, batch, threads",
                          sorted({cell_key(r) for rows in sittings for r in rows}), sittings,
                          cell, min)


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
    def cell(best: dict, key: tuple):
        if key not in best:
            return None
        ours, ot, theirs, tt = best[key]
        ratio = round(ours / theirs, 2)
        return f"{ours} ({ot}t) / {theirs} ({tt}t) ({ratio})", ratio

    per_sitting = [best_thread_rows(rows) for rows in sittings]
    return sittings_table("precision, beam, batch", sorted({k for b in per_sitting for k in b}),
                          per_sitting, cell, min)


def cost(ratio: float) -> str:
    return f"**{ratio:.3f}**" if ratio < COST_BOLD_BELOW else f"{ratio:.3f}"


def score_cost_table(sittings: list[list[dict]]) -> list[str]:
    """Per cell and sitting: scored / plain speed, ours / CTranslate2."""
    def cell(rows: list[dict], key: tuple):
        both = {r["engine"]: r for r in rows if cell_key(r) == key}
        if set(both) != {"ours", "ctranslate2"}:
            return None
        ours, theirs = both["ours"], both["ctranslate2"]
        return (f"{cost(ours['scored_vs_plain'])} / {cost(theirs['scored_vs_plain'])}",
                (ours["scored_vs_plain"], theirs["scored_vs_plain"],
                 round(ours["scored_sent_per_s"] / theirs["scored_sent_per_s"], 2)))

    def worst(figures: list[tuple]) -> str:
        ours, theirs, speeds = zip(*figures)
        return f"{cost(min(ours))} | {cost(min(theirs))} | {min(speeds)}"

    return sittings_table("precision, beam, batch, threads",
                          sorted({cell_key(r) for rows in sittings for r in rows}), sittings,
                          cell, worst, ("worst, ours", "worst, CTranslate2",
                                        "with scores, ours / CTranslate2, worst"))


def report(sittings: list[dict]) -> str:
    blocks = [heading(sittings) + quality_line(sittings)]
    speed = [speed_rows(s) for s in sittings]
    if any(speed):
        blocks += [cell_table(speed), best_thread_table(speed)]
    costs = [rows_of(s, "score_cost") for s in sittings]
    if any(costs):
        blocks.append(score_cost_table(costs))
    return "\n\n".join("\n".join(block) for block in blocks if block)


app = cli_app()


@app.command(help=__doc__)
def main(files: list[Path] = typer.Argument(..., help="engines_vs_ctranslate2 --json files, or "
                                            "files of several sittings"),
         merge: Path = typer.Option(None, metavar="OUT", help="Also write every sitting given "
                                    'to OUT as {"sittings": [...]}.')) -> None:
    sittings = [s for path in files for s in read_sittings(path)]
    if merge:
        write_json(merge, {"sittings": sittings}, indent=1)
    print(report(sittings))


if __name__ == "__main__":
    run_cli(app)
