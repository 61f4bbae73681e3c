"""The ONNX graph: the search model (encoder and decoder subgraphs under the contrib BeamSearch
node, and the same nodes in a Loop that drops finished sentences), its fused attention, and the
text-in, text-out twin."""
