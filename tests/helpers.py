"""Helpers shared by the CLI-level tests: a scratch project root and a stage runner."""

from __future__ import annotations

import ast
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

# A model and corpus small enough that each stage takes seconds on the toy corpus.
TINY_PARAMS = {
    "split": {"valid_size": 0.1, "test_size": 0.1},
    "tokenize": {"vocab_size": 120, "byte_fallback": False, "character_coverage": 1.0},
    "model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "ffn_dim": 64, "max_positions": 64},
}


def write_pairs(path: Path, pairs) -> Path:
    """A corpus or test-set TSV: one `source<TAB>target` line per pair."""
    path.write_text("".join(f"{en}\t{zh}\n" for en, zh in pairs), encoding="utf-8")
    return path


def scratch_root(tmp_path: Path, **overrides: dict) -> Path:
    """A directory with the committed params.yaml, sections updated from `overrides`."""
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["download"]["test_sets"] = []  # the committed HSK sets come from PyPI: none offline
    for section, values in overrides.items():
        params[section].update(values)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return tmp_path


GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def sh(cwd: Path, *cmd: str, env: dict[str, str] | None = None) -> str:
    """Run a command as a user would (tracking on, the project's own store), or fail the
    test with its output; returns stdout + stderr."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"NMT_TRACKING", "NMT_ROOT", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"}
    }
    result = subprocess.run(
        cmd, cwd=cwd, env={**base, **GIT_ENV, **(env or {})}, capture_output=True, text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def git_project(root: Path, settings: dict[str, object]) -> Path:
    """A git repo at `root` holding this checkout's pipeline (src, dvc.yaml, params.yaml, DVC
    config), params.yaml changed by `settings` ({"train.epochs": 2} as `dvc exp run -S`)."""
    for name in ("src", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".dvc/config"):
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, target)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["download"]["test_sets"] = []  # the committed HSK sets come from PyPI: none offline
    for key, value in settings.items():
        section, name = key.split(".")
        params[section][name] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(root, "git", "init", "-q")
    sh(root, "git", "add", "-A")
    sh(root, "git", "commit", "-qm", "project")
    return root


def stage_module(stage: str) -> str:
    """The module a dvc.yaml stage runs (`tokenize` -> `src.tokenize_corpus`); other names, such
    as `infer`, are modules already."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    return stages[stage]["cmd"].split()[2] if stage in stages else f"src.{stage}"


def python_snippet(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c code` from the repository root (src/ importable), its output as text."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def clean_environ() -> dict[str, str]:
    """This process's environment without MLflow's store URIs: `mlflow.set_tracking_uri` in
    one test exports MLFLOW_TRACKING_URI, and a stage run by a later test would then log to
    that test's store instead of its own project's mlflow.db."""
    return {k: v for k, v in os.environ.items()
            if k not in {"MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"}}


def run_stage(
    root: Path, stage: str, *args: str, stdin: str | None = None, tracking: bool = False,
    stdin_bytes: bytes | None = None, env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python -m src.<module>` of a stage with NMT_ROOT=root, as DVC runs it (code from this
    checkout); `env` adds to its environment."""
    env = {**clean_environ(), "NMT_ROOT": str(root), "NMT_TRACKING": "on" if tracking else "off",
           **(env or {})}
    if stdin_bytes is not None:  # raw bytes in; output decoded leniently for the asserts
        result = subprocess.run([sys.executable, "-m", stage_module(stage), *args], cwd=REPO,
                                env=env, input=stdin_bytes, capture_output=True, timeout=600)
        return subprocess.CompletedProcess(
            result.args, result.returncode, result.stdout.decode("utf-8", "replace"),
            result.stderr.decode("utf-8", "replace"))
    return subprocess.run(
        [sys.executable, "-m", stage_module(stage), *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_module_imports(module: str, args: list[str], watched: tuple[str, ...],
                       env: dict[str, str] | None = None
                       ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python -m module *args` (its exit code, its output) in a process that then says which
    of the `watched` modules anything imported: (the run, its stdout without that last line;
    those imported)."""
    code = ("import runpy, sys\nsys.argv = sys.argv[1:]\ncode = 0\n"
            "try:\n    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
            "except SystemExit as exit:\n    code = exit.code\n"
            f"print('imported:', *[m for m in {watched!r} if m in sys.modules])\n"
            "sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, module, *args], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    imported = lines.pop().split()[1:] if lines and lines[-1].startswith("imported:") else []
    result.stdout = "".join(f"{line}\n" for line in lines)
    return result, imported


def run_stage_watching(root: Path, stage: str, watched: tuple[str, ...],
                       env: dict[str, str] | None = None
                       ) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a stage as `run_stage` does (NMT_ROOT=root, untracked; `env` adds to that), in a
    process that then says which of the `watched` modules it imported: (the run, those)."""
    env = {**clean_environ(), "NMT_ROOT": str(root), "NMT_TRACKING": "off", **(env or {})}
    return run_module_imports(stage_module(stage), [], watched, env)


def stage_imports_torch(root: Path, stage: str, env: dict[str, str] | None = None) -> bool:
    """Whether a stage that must succeed imported torch (seconds), run as `run_stage` does."""
    result, imported = run_stage_watching(root, stage, ("torch",), env)
    assert result.returncode == 0, result.stderr
    return "torch" in imported


def assert_one_line_error(
    result: subprocess.CompletedProcess, fragment: str, code: int = 1
) -> None:
    """Failure with exit `code` (2: bad command line) and a single `error: …` line naming the
    problem, no traceback."""
    assert result.returncode == code, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def train_cfg(**overrides):
    """A complete TrainParams for in-process training tests."""
    from src.core.params import TrainParams

    base = dict(
        seed=0,
        epochs=1,
        max_steps=0,
        max_tokens=100,
        accumulation_steps=1,
        lr=1e-3,
        warmup_steps=4,
        schedule="inverse_sqrt",
        weight_decay=0.0,
        label_smoothing=0.1,
        rdrop_alpha=0.0,
        concat_ratio=0.0,
        bidirectional_epochs=0,
        subword_alpha=0.0,
        target_word_dropout=0.0,
        clip_norm=1.0,
        max_minutes=0,
        select_by="loss",
        patience=0,
        average_best=1,
        threads=0,
        log_every_steps=1,
        nproc_per_node=1,
        precision="fp32",
        length_multiple=1,
        valid_max_length_ratio=2.0,
    )
    return TrainParams(**{**base, **overrides})


# Projects tokenized in this pytest run, by the params their three stages read: a later
# tokenize_toy with the same settings copies one (the stages' outputs name no path of their
# root, so a copy is what the stages would write) instead of running them again.
_TOKENIZED: dict[str, Path] = {}
TOKENIZE_SECTIONS = ("download", "split", "tokenize")


def tokenize_toy(root: Path, reuse: bool = True, **overrides: dict) -> Path:
    """A scratch project with the toy corpus downloaded, split and tokenized: a copy of this
    process's earlier project of the same settings where there is one, unless `reuse` is
    False (a test that the stages themselves give the same bytes twice)."""
    from toy_corpus import toy_tsv

    root = scratch_root(root, **overrides)
    corpus = toy_corpus_file()
    if not corpus.exists():
        corpus.write_text(toy_tsv(), encoding="utf-8")
        atexit.register(corpus.unlink, True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["download"]["url"] = str(corpus)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    key = json.dumps([params[name] for name in TOKENIZE_SECTIONS], sort_keys=True)
    if reuse and key in _TOKENIZED:
        for name in ("data", "models"):
            shutil.copytree(_TOKENIZED[key] / name, root / name, dirs_exist_ok=True)
        return root
    for stage in TOKENIZE_SECTIONS:
        assert run_stage(root, stage).returncode == 0
    if key not in _TOKENIZED:
        cached = Path(tempfile.mkdtemp(prefix="tokenized-"))
        atexit.register(shutil.rmtree, cached, True)
        for name in ("data", "models"):
            shutil.copytree(root / name, cached / name)
        _TOKENIZED[key] = cached
    return root


def toy_corpus_file() -> Path:
    """The toy corpus as one file per pytest run, so every project's download.url is the same
    and their tokenized outputs are alike byte for byte."""
    return Path(tempfile.gettempdir()) / f"nmt-toy-corpus-{os.getpid()}.tsv"


def set_train_params(root: Path, **train) -> None:
    """Set keys of the `train:` section in root's params.yaml, e.g. epochs=300."""
    text = (root / "params.yaml").read_text()
    for key, value in train.items():
        lines = [ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:")]
        text = text.replace(lines[0], f"  {key}: {value}")
    (root / "params.yaml").write_text(text)


def fresh_copy(src: Path, dst: Path) -> Path:
    """A copy of a tokenized project without its trained models (the tokenizer kept)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("models"))
    shutil.copytree(src / "models/tokenizer", dst / "models/tokenizer")
    return dst


def train_with_failpoint(root: Path, failpoint: str = "", every: int | None = None
                         ) -> subprocess.CompletedProcess:
    """`python -m src.train` in `root`, killed at `failpoint` (src/core/failpoints.py) if given,
    saving last.pt every `every` steps: by default after every step when killed, else at the
    stage's own interval (longer than a toy epoch: at epoch ends only). A save a step costs a
    fifth of a toy run, and where saves happen never changes the weights: the resume tests end
    bitwise on runs saved both ways."""
    if every is None and failpoint:
        every = 1
    interval = [] if every is None else ["--checkpoint-every-steps", str(every)]
    env = {**clean_environ(), "NMT_ROOT": str(root), "NMT_TRACKING": "off",
           "NMT_FAILPOINT": failpoint}
    return subprocess.run(
        [sys.executable, "-m", "src.train", *interval],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )


def module_file(dotted: str) -> Path | None:
    """`src.core.paths` -> src/core/paths.py, `src.core` -> src/core/__init__.py, else None."""
    for path in (REPO / (dotted.replace(".", "/") + ".py"),
                 REPO / dotted.replace(".", "/") / "__init__.py"):
        if path.is_file():
            return path
    return None


def src_imports(module: str, seen: set[str] | None = None) -> set[str]:
    """Every src/ file `module` (dotted, below src) imports, transitively, as repo-relative
    paths, with the `__init__.py` of every package on the way."""
    seen = set() if seen is None else seen
    path = module_file(f"src.{module}")
    rel = path.relative_to(REPO).as_posix()
    if rel in seen:
        return seen
    seen.add(rel)
    parts = module.split(".")
    for i in range(1, len(parts)):  # importing src.a.b runs src/a/__init__.py first
        src_imports(".".join(parts[:i]), seen)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "src" or node.module.startswith("src.")):
            names = [node.module]
            # `from src.core import paths`: paths is a module of that package
            names += [f"{node.module}.{a.name}" for a in node.names
                      if module_file(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("src.")]
        for name in names:
            if name != "src" and module_file(name):
                src_imports(name.removeprefix("src."), seen)
    return seen
