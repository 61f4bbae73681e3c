"""Data-parallel training: who this process is, the collectives train needs, and the launcher.

`train` runs as one process, or as one process per rank under torchrun (or started by itself
from `train.nproc_per_node`, so `dvc repro` never leaves DVC). torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) says which; the process group uses gloo on
CPU and nccl on CUDA. With one process every collective here is the identity, so the
single-process path has no distributed code in its way.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from src.core.cpus import usable_cpus

# Rank 0 validates while the others wait in a broadcast: allow a long validation.
COLLECTIVE_TIMEOUT = timedelta(hours=2)
# Exit code of a rank whose collective failed because another rank died: the launcher then
# names the rank that failed first instead of the ones that lost it.
LOST_PEER = 75
PEER_LOSS_MARKERS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                     "communicator was aborted")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints, metrics, curves and the MLflow run."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def default_threads(self) -> int:
        """All the CPUs the process may use when alone, an equal share per rank on one machine."""
        return max(1, usable_cpus() // self.local_size)

    # -- collectives (identity with one process) -------------------------------------------
    def sum(self, values: list[float]) -> list[float]:
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)  # gloo reduces CPU tensors; nccl would need them on the GPU
        return tensor.tolist()

    def from_main(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj` (in rank order) on rank 0, [] on the others."""
        if not self.distributed:
            return [obj]
        out = [None] * self.size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out or []

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def die_with_launcher() -> None:
    """Ask Linux to SIGKILL this rank when its launcher dies. torchrun stops its ranks when it
    is stopped politely, but after `kill -9` of the launcher (or of `dvc repro` above it) the
    ranks would go on training as orphans and race the next run for the checkpoints."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    launcher = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != launcher:  # it died before the request was in place
        os._exit(LOST_PEER)


def init_world() -> World:
    """Join the process group torchrun set up, or a world of one."""
    if under_launcher():
        die_with_launcher()
    size = int(os.environ.get("WORLD_SIZE", "1"))
    world = World(
        rank=int(os.environ.get("RANK", "0")),
        size=size,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    )
    if world.distributed and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(world.local_rank)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return world


def shutdown(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def exit_if_peer_lost(world: World, exc: BaseException) -> None:
    """A collective that failed because another rank died: leave quietly (no cleanup, which
    could wait for the dead rank), so the only lines printed are that rank's and the
    launcher's."""
    network = isinstance(exc, getattr(dist, "DistNetworkError", ()))
    if world.distributed and (network or (isinstance(exc, RuntimeError) and any(
            marker in str(exc) for marker in PEER_LOSS_MARKERS))):
        sys.stderr.flush()
        os._exit(LOST_PEER)


def under_launcher() -> bool:
    """True inside a rank started by torchrun (or by `launch`)."""
    return "LOCAL_RANK" in os.environ


def launch(nproc_per_node: int, module: str, args: list[str]) -> int:
    """Run `python -m module args` as `nproc_per_node` ranks on this machine, as
    `torchrun --standalone --nproc_per_node N -m module` does; return the exit code.

    A rank that fails ends every rank (torchrun's agent stops the others); instead of the
    agent's report, one line says which rank failed and how. The failing rank has already
    printed its own one-line error.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc_per_node,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
    )
    try:
        elastic_launch(config, sys.executable)("-u", "-m", module, *args)
    except ChildFailedError as exc:
        causes = {r: f for r, f in exc.failures.items() if f.exitcode != LOST_PEER}
        rank, failure = min((causes or exc.failures).items(), key=lambda rf: rf[1].timestamp)
        print(f"error: {module.removeprefix('src.')}: rank {rank} of {nproc_per_node} "
              f"{describe_exit(failure.exitcode)}, so every rank was stopped; run it again to "
              "resume from the last checkpoint", file=sys.stderr)
        return 1
    return 0


def describe_exit(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
