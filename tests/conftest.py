"""Shared fixtures. Tracking is off for unit tests; the end-to-end test turns it on."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(Path(__file__).parent))  # toy_corpus

os.environ.setdefault("NMT_TRACKING", "off")

# Property tests (Hypothesis): under mutation testing (bench.mutation_score sets
# HYPOTHESIS_PROFILE=mutation) a failing example kills the mutant at once, without the shrinking
# that would find a smaller one; set before the test modules build their settings.
settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# Marks that say what a test needs; each of them costs tens of seconds at least.
NEEDS = ("e2e", "browser", "venv", "gpu")


def pytest_configure(config):
    """Under pytest-xdist's `--dist loadfile`, files go to the workers in the order collected
    (below) instead of the most tests first: a file of two minute-long tests was handed out
    last, and one worker ran it while the other had finished.

    Each worker runs on CPUs of its own, and so does every process it starts: the stages size
    their thread pools by the CPUs they may use (src/core/cpus.py), and two workers' exports
    side by side, each on both CPUs, took 26-33 s where each on one took 18-19."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and workers > 1 and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        index = int(worker.removeprefix("gw"))
        own = cpus[index % workers::workers] or [cpus[index % len(cpus)]]
        os.sched_setaffinity(0, own)


def pytest_collection_modifyitems(items):
    """A test that needs a pipeline run, a browser, a fresh environment or the GPU check is
    slow as well, so the inner loop's `-m "not slow"` never waits for one. Files of pipeline
    runs come first, then other slow files, then the rest, each file's tests in their order:
    the longest work starts first, and the short files fill in around it."""
    for item in items:
        if any(item.get_closest_marker(name) for name in NEEDS):
            item.add_marker(pytest.mark.slow)
    rank: dict[Path, int] = {}
    for item in items:
        kind = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        rank[item.path] = min(rank.get(item.path, 2), kind)
    items.sort(key=lambda item: rank[item.path])  # a stable sort: files stay whole


@pytest.fixture
def toy_tsv(tmp_path: Path) -> Path:
    from toy_corpus import toy_tsv

    path = tmp_path / "toy.tsv"
    path.write_text(toy_tsv(), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def sys_path_restored():
    """Every test leaves sys.path as it found it. mlflow.pyfunc.load_model puts the model's
    code folder first and never takes it out: a `src` holding only the served modules, which a
    later test's spawned process (test_distributed's ranks) would then import instead of ours
    when both files run in one worker (`-n auto --dist loadfile` puts them anywhere)."""
    before = list(sys.path)
    yield
    sys.path[:] = before


@pytest.fixture(autouse=True)
def mlflow_state_restored():
    """Every test leaves MLflow's process state as it found it: `set_experiment` keeps the
    experiment's id in the process and in MLFLOW_EXPERIMENT_ID, `set_tracking_uri` exports
    MLFLOW_TRACKING_URI, and a later test's run in another store would look there for an
    experiment it does not hold (or a stage it spawns would log to the wrong store)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    yield
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        del os.environ[key]
    os.environ.update(before)
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._active_experiment_id = None


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module's tests: tiny models gain nothing from threads, and
    oversubscribed cores make them crawl. Modules ask for it with `usefixtures`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)`'s project, built once per pytest run and then only read (a test that
    changes it works on a copy). Under xdist the workers share it: the first builds it in the
    run's common temporary folder while the others wait on a lock; a build that fails leaves
    no mark, so the next worker builds it again."""
    import fcntl

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's
    root, built = shared / name, shared / f"{name}.built"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not built.exists():
            shutil.rmtree(root, ignore_errors=True)  # a half-built one from a failed worker
            build(root)
            built.touch()
    return root


@pytest.fixture(scope="session")
def exported_toy(tmp_path_factory) -> Path:
    """The toy project trained and exported (tests/toy_projects.py), which test_export,
    test_web and the GPU check read (building it takes about 20 s of a core)."""
    from toy_projects import exported_project

    return built_once(tmp_path_factory, "exported-toy", exported_project)


@pytest.fixture(scope="session")
def toy_parent(tmp_path_factory) -> Path:
    """A tiny model the train stage trained on every other toy pair: train.init_from's parent
    in test_init_from and the fine-tune pilot's."""
    from toy_projects import trained_parent

    return built_once(tmp_path_factory, "toy-parent", trained_parent)


@pytest.fixture(scope="session")
def toy_child(tmp_path_factory, toy_parent) -> Path:
    """Every toy pair (half of them new to `toy_parent`), train.init_from its model.pt,
    resolved by the parent stage and tokenized with the parent's tokenizer; nothing trained."""
    from toy_projects import child_of, resolve_and_tokenize

    return built_once(tmp_path_factory, "toy-child", lambda root: resolve_and_tokenize(
        child_of(root, str(toy_parent / "models/model.pt"))))
