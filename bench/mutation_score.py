"""Mutation testing (mutmut 3) of pyproject.toml's [tool.mutmut] modules: the share of mutants
the tests kill per module, run in a copy whose package `src` is renamed `nmtsrc` (mutmut 3
refuses a package named `src`): docs/testing.md, docs/benchmarks/mutation.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import tomllib
import typer

from bench import common
from bench.common import REPO, markdown_table

RENAMED = "nmtsrc"
# Our package's modules and subpackages: `src.` / `src/` is renamed only before one of them, so
# a variable named `src` (`src.shape`, the search's source ids) keeps its name.
PACKAGE = sorted(p.stem for p in (REPO / "src").iterdir()
                 if p.suffix == ".py" or (p / "__init__.py").is_file())
# `src.<ours>`, `src/<ours>` and the folder `"src/"` (not inside another word such as `resrc.`)
_NAMES = "|".join(map(re.escape, PACKAGE))
OURS = re.compile(rf"(?<![\w.])src(?=/[\"']|[./](?:{_NAMES})\b)")


def copy_renamed(work: Path) -> None:
    # tracked files and new ones not ignored (a test written but not yet committed counts)
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, text=True, check=True
                             ).stdout.splitlines()
    if work.exists():
        shutil.rmtree(work)
    for rel in tracked:
        source = REPO / rel
        if not source.is_file():
            continue
        target = work / OURS.sub(RENAMED, rel, count=1)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.suffix in {".py", ".toml", ".yaml", ".md", ".cfg"} or source.name == "run":
            text = source.read_text(encoding="utf-8")
            text = OURS.sub(RENAMED, text).replace("from src import", f"from {RENAMED} import")
            target.write_text(text, encoding="utf-8")
        else:
            shutil.copy2(source, target)


def scores(work: Path) -> dict[str, Counter]:
    """{module file: Counter(status)} from mutmut's per-file .meta results, named as mutmut
    names them (`mutmut.stats.status_by_exit_code`)."""
    from mutmut.stats import status_by_exit_code

    out: dict[str, Counter] = {}
    for meta in (work / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text())
        rel = meta.relative_to(work / "mutants").as_posix().removesuffix(".meta")
        counts = Counter(status_by_exit_code[code]
                         for code in data.get("exit_code_by_key", {}).values())
        if counts:
            out[rel.replace(RENAMED, "src", 1)] = counts
    return out


TABLE_START, TABLE_END = "<!-- mutation table -->", "<!-- /mutation table -->"


def merged(path: Path, rows: list[dict], command: str) -> dict:
    """The file's rows with this run's replacing those of the same modules, by module."""
    old = json.loads(path.read_text())["rows"] if path.is_file() else []
    fresh = {row["module"] for row in rows}
    every = sorted([r for r in old if r["module"] not in fresh] + rows,
                   key=lambda r: r["module"])
    return {"command": command, "rows": every}


COUNTS = ("mutants", "killed", "survived", "no_tests")


def mutation_table(rows: list[dict]) -> str:
    """The per-module table of docs/testing.md, with the total."""
    total = {k: sum(r[k] for r in rows) for k in COUNTS}
    score = 100 * total["killed"] / max(total["mutants"], 1)
    body = [[f"`{r['module']}`", *(r[k] for k in COUNTS), f"{r['score']:.1f}%"] for r in rows]
    body.append(["**all**", *total.values(), f"{score:.1f}%"])
    return "\n".join(markdown_table(["module", "mutants", "killed", "survived", "no tests",
                                      "score"], body, ["---"] + ["---:"] * 5))


def write_table(doc: Path, rows: list[dict]) -> None:
    common.replace_block(doc, TABLE_START, TABLE_END, mutation_table(rows))


app = common.cli_app()


@app.command(help=__doc__)
def main(
    work: Path = typer.Option(REPO / ".mutation", help="The renamed copy (replaced)."),
    only: list[str] = typer.Option([], help="Only this src/ module (repeatable)."),
    json_out: Path = typer.Option(None, "--json", help="Write the per-module table here (rows "
                                  "of modules not run this time are kept)."),
    doc: Path = typer.Option(None, help="Rewrite the table of this markdown file from --json's "
                             "rows."),
) -> int:
    copy_renamed(work)
    if only:
        config = work / "pyproject.toml"
        text = config.read_text()
        wanted = [OURS.sub(RENAMED, m) for m in only]
        unknown = set(wanted) - set(tomllib.loads(text)["tool"]["mutmut"]["only_mutate"])
        if unknown:
            raise typer.BadParameter(f"not configured in [tool.mutmut]: {sorted(unknown)}",
                                     param_hint="--only")
        listed = f"only_mutate = {json.dumps(wanted)}"
        config.write_text(re.sub(r"only_mutate = \[.*?\]", lambda _: listed, text, count=1,
                                 flags=re.DOTALL))
    # One thread: a fork of a process holding OpenMP threads hangs, and each such mutant would
    # time out and count as killed; Hypothesis's `mutation` profile does not shrink (testing.md).
    env = os.environ | {"HYPOTHESIS_PROFILE": "mutation", "OMP_NUM_THREADS": "1",
                        "MKL_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=work, env=env)
    table = scores(work)
    rows = []
    for module, counts in sorted(table.items()):
        total = sum(counts.values())
        killed = counts["killed"] + counts["timeout"]
        rows.append({"module": module, "mutants": total, "killed": killed,
                     "survived": counts["survived"], "no_tests": counts["no tests"],
                     "score": round(100 * killed / max(total, 1), 1)})
        print(f"{module:32} {killed:5}/{total:<5} killed  {rows[-1]['score']:5.1f}%  "
              f"survived {counts['survived']}, no tests {counts['no tests']}")
    if json_out:
        table_rows = merged(json_out, rows, common.command())
        common.write_json(json_out, table_rows)
        if doc:
            write_table(doc, table_rows["rows"])
    return run.returncode


if __name__ == "__main__":
    common.run_cli(app)
