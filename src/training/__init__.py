"""Training, layer by layer: the train stage's work end to end (stage), its epoch loop with
the stops and saves (epochs), one optimizer step (step: the loss module, AdamW, the schedule);
exact resume, epoch selection, validation, data-parallel ranks, precision."""
