"""The ONNX graph: the search model (contrib BeamSearch around encoder and decoder subgraphs),
its fused attention, and the text-in, text-out twin."""
