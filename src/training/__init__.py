"""Training: one optimizer step (trainer: the loss module, AdamW, the schedule), the epoch loop
with its stops and saves (loop), the stage's work end to end (fit), exact resume, epoch
selection, validation, data-parallel ranks, precision."""
