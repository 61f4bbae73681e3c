"""Data in and out of the model: fetching corpora, SentencePiece subwords, token batches,
training-time augmentation."""
