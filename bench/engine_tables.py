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


def table_head(first: str, sittings: int, last: tuple = ("worst ratio",)) -> list[str]:
    return markdown_table([first, *(f"sitting {i + 1}" for i in range(sittings)), *last], [])


def cell_key(r: dict) -> tuple:
    return r["precision"], r["beam"], r["batch"], r["threads"]


def cell_table(sittings: list[list[dict]]) -> list[str]:
    keys = sorted({cell_key(r) for rows in sittings for r in rows})
    lines = table_head("precision, beam, batch, threads", len(sittings))
    for key in keys:
        cells, ratios = [], []
        for rows in sittings:
            row = next((r for r in rows if cell_key(r) == key), None)
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


def cost(ratio: float) -> str:
    return f"**{ratio:.3f}**" if ratio < COST_BOLD_BELOW else f"{ratio:.3f}"


def score_cost_table(sittings: list[list[dict]]) -> list[str]:
    """Per cell and sitting: scored / plain speed, ours / CTranslate2."""
    keys = sorted({cell_key(r) for rows in sittings for r in rows})
    lines = table_head("precision, beam, batch, threads", len(sittings),
                       ("worst, ours", "worst, CTranslate2",
                        "with scores, ours / CTranslate2, worst"))
    for key in keys:
        cells, worst, speeds = [], {"ours": [], "ctranslate2": []}, []
        for rows in sittings:
            cell = {r["engine"]: r for r in rows if cell_key(r) == key}
            if set(cell) != {"ours", "ctranslate2"}:
                cells.append("")
                continue
            for engine, row in cell.items():
                worst[engine].append(row["scored_vs_plain"])
            cells.append(f"{cost(cell['ours']['scored_vs_plain'])} / "
                         f"{cost(cell['ctranslate2']['scored_vs_plain'])}")
            speeds.append(round(cell["ours"]["scored_sent_per_s"]
                                / cell["ctranslate2"]["scored_sent_per_s"], 2))
        if not speeds:
            continue
        lines.append(f"| {key[0]} {key[1]} {key[2]}, {key[3]} | " + " | ".join(cells)
                     + f" | {cost(min(worst['ours']))} | {cost(min(worst['ctranslate2']))} "
                     f"| {min(speeds)} |")
    return lines


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
