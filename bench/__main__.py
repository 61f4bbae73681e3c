"""`python -m bench`: every tool with the first paragraph of its docstring, which says what it
measures and the page and file it feeds (read from the source: no tool is imported)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

HERE = Path(__file__).parent


def tools() -> dict[str, str]:
    """Each tool's module name -> the first paragraph of its docstring, on one line."""
    found = {}
    for path in sorted(HERE.glob("*.py")):
        if not path.stem.startswith("_") and path.stem != "common":
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            found[path.stem] = " ".join(doc.split("\n\n")[0].split())
    return found


def listing() -> str:
    lines = ["python -m bench.<tool> --help for its options; each feeds a page and a file:"]
    for name, what in tools().items():
        lines += ["", name, *textwrap.wrap(what, 92, initial_indent="    ",
                                           subsequent_indent="    ")]
    return "\n".join(lines)


if __name__ == "__main__":
    print(listing())
