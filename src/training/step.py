"""One optimizer step of the Transformer: the loss as one module (so DDP syncs what it ran),
AdamW with warmup then inverse-sqrt or cosine decay, clipping, accumulation over micro-batches,
autocast in the resolved precision, and last.pt's save and resume (weights, optimizer,
scheduler, scaler, step, every rank's RNG)."""

from __future__ import annotations

import inspect
import math
import random
from contextlib import nullcontext

import torch

from src.core import failpoints
from src.core.params import TrainParams
from src.data.augment import drop_target_words
from src.data.batching import Batch, batches_per_step
from src.data.subword import PAD
from src.nmt import checkpoint
from src.nmt.model import Transformer
from src.training.distributed import World
from src.training.precision import Precision, resolve_precision
from src.training.resume import ResumeStore, TrainState, note, rng_state, set_rng_state
from src.training.validation import token_loss


def lr_factor(step: int, cfg: TrainParams, total_steps: int) -> float:
    """Multiplier of `train.lr` at optimizer step `step` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(max(cfg.warmup_steps, 1) / (step + 1)) if cfg.warmup_steps else 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class SmoothedLoss(torch.nn.Module):
    """The training loss as one module call: DDP syncs gradients of what its forward ran."""

    def __init__(self, model: Transformer, label_smoothing: float, rdrop_alpha: float = 0.0):
        super().__init__()
        self.model, self.label_smoothing, self.rdrop_alpha = model, label_smoothing, rdrop_alpha

    def forward(self, src, tgt_in, tgt_out) -> torch.Tensor:
        return token_loss(self.model, Batch(src, tgt_in, tgt_out), self.label_smoothing,
                          self.rdrop_alpha)[0]


class AdamW(torch.optim.AdamW):
    """torch's AdamW, its arithmetic and state_dict unchanged, without the guards for
    torch.compile around its methods: each of them imports torch._dynamo on first use, about
    1.3 s of every train process's start (the suite starts dozens), for a compiler the stage
    never runs. A torch that drops the decorators leaves the methods as they are."""

    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
    _adamw_step = inspect.unwrap(torch.optim.AdamW.step)

    def step(self, closure=None):
        # What the decorator does, less its two torch._dynamo.graph_break() calls.
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return AdamW._adamw_step(self, closure)


class Trainer:
    def __init__(
        self,
        model: Transformer,
        cfg: TrainParams,
        device: torch.device,
        total_steps: int,
        store: ResumeStore,
        threads: int,
        world: World = World(),
        precision: Precision | None = None,
    ):
        precision = precision or resolve_precision(cfg.precision, device)[0]
        self.model, self.cfg, self.device, self.world = model, cfg, device, world
        self.loss = SmoothedLoss(model, cfg.label_smoothing, cfg.rdrop_alpha)
        if world.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            # The only buffer (the sinusoidal table) is equal everywhere: sync it at most once.
            # torch 2.13 renamed the knob and warns about the old name.
            no_resync = ({"forward_sync_buffers": False}
                         if "forward_sync_buffers" in inspect.signature(DDP).parameters
                         else {"broadcast_buffers": False})
            self.loss = DDP(self.loss, device_ids=[device.index] if device.type == "cuda"
                            else None, **no_resync)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        self.optimizer = AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=(0.9, 0.98),
            eps=1e-9,
            fused=True,  # one kernel over all tensors instead of ~10 ops per tensor
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, cfg, total_steps)
        )
        self.precision = precision
        precision.set_matmul_precision()
        self.scaler = torch.amp.GradScaler("cuda", enabled=precision.needs_scaler)
        self.store = store
        self.state = TrainState(threads=threads, world_size=world.size)

    # -- resume ----------------------------------------------------------------------------
    def save_last(self) -> None:
        """Every rank must call this (their RNG states are gathered); rank 0 writes."""
        rngs = self.world.gather(rng_state())
        if self.world.is_main:
            self.store.save(
                self.state,
                self.model,
                rng=rngs,
                optimizer=self.optimizer.state_dict(),
                scheduler=self.scheduler.state_dict(),
                scaler=self.scaler.state_dict(),
            )

    def try_resume(self) -> bool:
        # Rank 0 decides (and may set an incompatible folder aside); the others follow.
        caps = {"step": self.cfg.max_steps, "epoch": self.cfg.epochs}
        ckpt = self.store.load(caps=caps) if self.world.is_main else None
        if not self.world.from_main(ckpt is not None):
            return False
        if ckpt is None:
            ckpt = checkpoint.load(self.store.last)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        threads = self.state.threads
        self.state = TrainState(**ckpt["state"])
        rngs = ckpt["rng"] if isinstance(ckpt["rng"], list) else [ckpt["rng"]]
        say = print if self.world.is_main else (lambda *a, **k: None)
        say(f"train: resumed from {self.store.last} at step {self.state.step}, "
            f"epoch {self.state.epoch + 1}, batch {self.state.batch_in_epoch}")
        if len(rngs) == self.world.size:
            set_rng_state(rngs[self.world.rank])
        else:
            # Weights, optimizer, schedule and the position in the epoch carry over; each
            # rank's dropout stream cannot, so it is seeded from (seed, step, rank).
            set_rng_state(rngs[0])
            torch.manual_seed(self.cfg.seed + 1_000_003 * self.state.step + self.world.rank)
            if self.world.is_main:
                note(f"resumed with {self.world.size} ranks where last.pt was written by "
                     f"{len(rngs)}: from here a step takes "
                     f"{batches_per_step(self.cfg.accumulation_steps, self.world.size)} "
                     "batches and dropout is reseeded, so the run differs from one that kept "
                     "its world size")
        if self.state.threads and self.state.threads != threads and self.world.is_main:
            note(f"resumed with {threads} threads where the run so far used "
                 f"{self.state.threads}: the float sums may differ in the last bits")
        self.state.threads, self.state.world_size = threads, self.world.size
        return True

    # -- one optimizer step ------------------------------------------------------------------
    def step(self, batches: list[Batch], n_target: int | None = None) -> tuple[float, int]:
        """Accumulate gradients over `batches`, then one clipped optimizer step.

        `n_target`: target tokens of the whole global step (every rank's batches); the loss
        and tokens returned are the global ones too.
        """
        self.model.train()
        if n_target is None:
            n_target = sum(int((b.tgt_out != PAD).sum()) for b in batches)
        loss_sum, tokens = 0.0, 0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            # Ranks exchange gradients once per optimizer step, after its last micro-batch.
            last = i == len(batches) - 1
            no_sync = self.loss.no_sync() if self.world.distributed and not last else nullcontext()
            with no_sync:
                with self.precision.autocast():
                    tgt_in = drop_target_words(batch.tgt_in, self.cfg.target_word_dropout)
                    loss = self.loss(batch.src, tgt_in, batch.tgt_out)
                # Normalised by the target tokens of the whole global step, not per batch;
                # DDP averages over ranks, so the world size scales the mean back to the sum.
                self.scaler.scale(loss / max(n_target, 1) * self.world.size).backward()
            loss_sum += loss.item()
            tokens += batch.n_tokens
            failpoints.hit("during_step")
        loss_sum, tokens = self.world.sum([loss_sum, tokens])
        self.scaler.unscale_(self.optimizer)
        if self.cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss_sum / max(n_target, 1), int(tokens)
