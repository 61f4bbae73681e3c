"""The tables of docs/engines.md, from the sittings bench.engines_vs_ctranslate2 writes
(docs/benchmarks/engines_*.json, score_cost_both.json): the
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


def distinct(values) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values if v is not None))


def heading(sittings: list[dict]) -> list[str]:
    commits = distinct(s.get("commit") for s in sittings)
    machines = distinct(s.get("machine") for s in sittings)
    parts = ([f"commit {commits}"] if commits else []) + ([machines] if machines else [])
    count = f"{len(sittings)} sitting{'s' if len(sittings) != 1 else ''}"
    return [f"{count}: {'; '.join(parts)}."] if parts else [f"{count}."]


def quality_line(sittings: list[dict]) -> list[str]:
    """One line: each checked configuration's identical strings and BLEU, ours / CTranslate2
    (a range where the sittings differ)."""
    rows = [r for s in sittings for r in rows_of(s, "quality")]
    if not rows:
        return []
    parts = []
    for key in dict.fromkeys((r["precision"], r["beam"], r["batch"]) for r in rows):
        same = [r for r in rows if (r["precision"], r["beam"], r["batch"]) == key]
        parts.append(f"{key[0]} beam {key[1]} batch {key[2]}: "
                     f"{span([r['identical'] for r in same], lambda s: f'{100 * s:.1f}%')} "
                     f"identical, BLEU {span([r['bleu_ours'] for r in same])} / "
                     f"{span([r['bleu_ctranslate2'] for r in same])}")
    sentences = span([r["sentences"] for r in rows])
    return [f"Test split ({sentences} sentences), ours / CTranslate2: {'; '.join(parts)}."]


def cell_key(r: dict) -> tuple:
    return r["precision"], r["beam"], r["batch"], r["threads"]


def sittings_table(first: str, key_of, sittings: list[list[dict]], cell, worst,
                   last: tuple = ("worst ratio",)) -> list[str]:
    """A row per key of the rows (`key_of`), a column per sitting: `cell(rows, key)` is (its
    text, its figure), or None where the sitting lacks the key; then `worst(figures)`, the last
    columns. A key (precision, beam, batch[, threads]) reads 'int8 1 32[, 2]'."""
    table = []
    for key in sorted({key_of(r) for rows in sittings for r in rows}):
        found = [cell(rows, key) for rows in sittings]
        figures = [f[1] for f in found if f is not None]
        if figures:
            table.append([" ".join(map(str, key[:3])) + (f", {key[3]}" if len(key) > 3 else ""),
                          *(f and f[0] for f in found), worst(figures)])
    return markdown_table([first, *(f"sitting {i + 1}" for i in range(len(sittings))), *last],
                          table)


def cell_table(sittings: list[list[dict]]) -> list[str]:
    def cell(rows: list[dict], key: tuple):
        row = next((r for r in rows if cell_key(r) == key), None)
        return row and (f"{row['ours_sent_per_s']} / {row['ctranslate2_sent_per_s']} "
                        f"({row['ours_vs_ctranslate2']})", row["ours_vs_ctranslate2"])

    return sittings_table("precision, beam, batch, threads", cell_key, sittings, cell, min)


def best_thread_table(sittings: list[list[dict]]) -> list[str]:
    """Each engine at its fastest thread count of the sitting (the first where two tie)."""
    def cell(rows: list[dict], key: tuple):
        same = [r for r in rows if cell_key(r)[:3] == key]
        if not same:
            return None
        ours = max(same, key=lambda r: r["ours_sent_per_s"])
        theirs = max(same, key=lambda r: r["ctranslate2_sent_per_s"])
        ratio = round(ours["ours_sent_per_s"] / theirs["ctranslate2_sent_per_s"], 2)
        return (f"{ours['ours_sent_per_s']} ({ours['threads']}t) / "
                f"{theirs['ctranslate2_sent_per_s']} ({theirs['threads']}t) ({ratio})", ratio)

    return sittings_table("precision, beam, batch", lambda r: cell_key(r)[:3], sittings, cell,
                          min)


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

    return sittings_table("precision, beam, batch, threads", cell_key, sittings, cell, worst,
                          ("worst, ours", "worst, CTranslate2",
                           "with scores, ours / CTranslate2, worst"))


def report(sittings: list[dict]) -> str:
    blocks = [heading(sittings) + quality_line(sittings)]
    speed = [rows_of(s, "speed") for s in sittings]
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
