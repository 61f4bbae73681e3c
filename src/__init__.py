"""English→Chinese NMT pipeline: download → split → tokenize → train → evaluate → export."""
