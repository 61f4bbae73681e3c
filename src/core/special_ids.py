"""The special token ids every part agrees on: tokenize trains SentencePiece with them, and the
PyTorch model, both searches and the ONNX graph read them from here."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
# Ids no search may emit (padding, the start token, unknown): PyTorch's search and the ONNX
# graph set their log-probabilities to -inf, so they must agree for parity.
BANNED = (PAD, BOS, UNK)
