"""The Transformer in PyTorch: the model, its dropout, checkpoints, and greedy/beam search."""
