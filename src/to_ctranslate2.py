"""to_ctranslate2: the trained checkpoint as a CTranslate2 model, same weights, same search.

    pip install -e '.[ctranslate2]'
    python -m src.to_ctranslate2 --output models/ct2     # models/model.pt + models/tokenizer

For comparing engines (bench.engines_vs_ctranslate2) and for users who serve with CTranslate2;
`ctranslate2` is an optional extra, never needed by the pipeline. Our Transformer maps onto
CTranslate2's `TransformerSpec` one to one: pre-norm layers with a final LayerNorm per stack,
ReLU FFN, token embeddings scaled by sqrt(d_model) plus our sinusoidal table (passed as the
position encodings, because CTranslate2's built-in table orders sin and cos differently), tied
output projection, LayerNorm epsilon 1e-5 (torch's default). The vocabularies are the
SentencePiece pieces in id order, so ids mean the same on both sides.

`ct2_options` gives the translate_batch arguments that make CTranslate2 search as our graph
does: the same output limit, and PAD, BOS and UNK never generated. Sources are fed with the
EOS piece appended, as our model was trained.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import typer

from src.core import paths
from src.core.cli import run_cli
from src.core.errors import PipelineError, require_file
from src.data.subword import BOS, PAD

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which the model uses


def _numpy(tensor):
    return tensor.detach().float().contiguous().numpy()


def _linear(spec, linear) -> None:
    spec.weight = _numpy(linear.weight)
    if linear.bias is not None:
        spec.bias = _numpy(linear.bias)


def _fused(spec, linears) -> None:
    """Several projections as one (CTranslate2 stores q|k|v, or k|v, stacked)."""
    import numpy as np

    spec.weight = np.concatenate([_numpy(lin.weight) for lin in linears])
    spec.bias = np.concatenate([_numpy(lin.bias) for lin in linears])


def _norm(spec, norm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _ffn(spec, residual, ffn) -> None:
    _norm(spec.layer_norm, residual.norm)
    _linear(spec.linear_0, ffn.net[0])
    _linear(spec.linear_1, ffn.net[3])


def _self_attention(spec, residual, attn) -> None:
    _norm(spec.layer_norm, residual.norm)
    _fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    _linear(spec.linear[1], attn.out_proj)


def _inputs(stack, embeddings, embed) -> None:
    """Token embedding x sqrt(d_model) + our sinusoidal table, as `Embeddings.forward`."""
    embeddings.weight = _numpy(embed.token.weight)
    stack.scale_embeddings = True
    stack.position_encodings.encodings = _numpy(embed.pe)


def build_spec(model, source_pieces: list[str], target_pieces: list[str]):
    """The CTranslate2 TransformerSpec of a `src.nmt.model.Transformer` (pre-norm only)."""
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.config
    if not c.pre_norm:
        raise PipelineError("CTranslate2 conversion supports pre-norm models (model.pre_norm)")
    spec = transformer_spec.TransformerSpec.from_config(
        (c.n_layers, c.n_decoder_layers), c.n_heads, pre_norm=True,
        activation=common_spec.Activation.RELU)
    encoder, decoder = spec.encoder, spec.decoder
    _inputs(encoder, encoder.embeddings[0], model.src_embed)  # a list: one source feature
    for layer_spec, layer in zip(encoder.layer, model.encoder):
        _self_attention(layer_spec.self_attention, layer.res_attn, layer.self_attn)
        _ffn(layer_spec.ffn, layer.res_ffn, layer.ffn)
    _norm(encoder.layer_norm, model.enc_norm)
    _inputs(decoder, decoder.embeddings, model.tgt_embed)
    for layer_spec, layer in zip(decoder.layer, model.decoder):
        _self_attention(layer_spec.self_attention, layer.res_self, layer.self_attn)
        cross = layer_spec.attention
        _norm(cross.layer_norm, layer.res_cross.norm)
        _linear(cross.linear[0], layer.cross_attn.q_proj)
        _fused(cross.linear[1], [layer.cross_attn.k_proj, layer.cross_attn.v_proj])
        _linear(cross.linear[2], layer.cross_attn.out_proj)
        _ffn(layer_spec.ffn, layer.res_ffn, layer.ffn)
    _norm(decoder.layer_norm, model.dec_norm)
    _linear(decoder.projection, model.generator)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.config.decoder_start_token = target_pieces[BOS]
    spec.register_source_vocabulary(source_pieces)
    spec.register_target_vocabulary(target_pieces)
    return spec


def pieces(processor) -> list[str]:
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def convert(model_path: Path, tokenizer_dir: Path, output_dir: Path) -> Path:
    """Write the CTranslate2 model directory (float32 weights; quantize when loading with
    `compute_type="int8"`)."""
    import sentencepiece as spm

    from src.nmt import checkpoint

    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise PipelineError("ctranslate2 is not installed: pip install -e '.[ctranslate2]'") \
            from None
    model, _ = checkpoint.load_model(model_path)
    source, target = (spm.SentencePieceProcessor(model_file=str(Path(tokenizer_dir) / name))
                      for name in ("source.model", "target.model"))
    spec = build_spec(model.eval(), pieces(source), pieces(target))
    spec.validate()
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    # written beside, then swapped in: a failed conversion leaves the old directory intact
    work = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        spec.save(str(work))
        if output_dir.exists():
            shutil.rmtree(output_dir)
        work.rename(output_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return output_dir


def ct2_options(target_pieces: list[str], beam: int, max_new_tokens: int,
                length_penalty: float) -> dict:
    """translate_batch arguments for the search our graph runs."""
    return {"beam_size": beam, "max_decoding_length": max_new_tokens,
            "length_penalty": length_penalty, "disable_unk": True,
            "suppress_sequences": [[target_pieces[PAD]], [target_pieces[BOS]]],
            "return_scores": False}


@app.command()
def main(
    model: Path = typer.Option(paths.MODELS / "model.pt", help="Checkpoint from `train`."),
    tokenizer: Path = typer.Option(paths.TOKENIZER, help="Tokenizer dir."),
    output: Path = typer.Option(paths.MODELS / "ct2", help="CTranslate2 model dir to write."),
) -> None:
    """Convert the trained checkpoint to a CTranslate2 model directory (same weights)."""
    require_file(model, "train")
    require_file(tokenizer, "tokenize")
    convert(model, tokenizer, output)
    print(f"to_ctranslate2: wrote {output} (load with compute_type='int8' for int8)")


if __name__ == "__main__":
    run_cli(app)
