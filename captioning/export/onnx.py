"""``captioning export --format onnx``: the encoder and the decoder's time step as ONNX graphs.

Two graphs make a captioner (onnx_captioner.py runs them with onnxruntime and numpy only). The LSTM's:

    encoder.onnx        images (B, 3, S, S) in [0, 1] -> features a (B, L, D), projected W_a a + b
                        (B, L, A), h_0 and c_0 (B, H): what depends only on the image, once per image
    decoder_step.onnx   tokens y_{t-1} (N,), h_{t-1}, c_{t-1} (N, H), features, projected
                        -> log p(y_t) (N, V), h_t, c_t (N, H), alpha_t (N, L)

N = B * K rows: image k's K beams are rows k*K ... (k+1)*K - 1 (the graph reads K from the shapes;
batch sizes are dynamic). A hard-attention model gets decoder_step_argmax.onnx too; decoder_step.onnx
takes the expected context at the generation's ``attention_temperature`` (recorded in config.json's
"onnx" section, with ``state``: how the search carries the step's state). The step traces the fast
path's step (captioning/fast/), whose scores take their one-product form when traced. Each decoder
kind has its exporter in :data:`EXPORTERS` (onnx_transformer.py: the transformer's, its cache carried).
Adaptive average pooling to a grid that does not divide the input is exported as two matrix products.
"""

from __future__ import annotations

import copy
import importlib
import io
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from captioning.errors import CheckpointError
from captioning.export.onnx_captioner import LSTM_STATE
from captioning.files import atomic_write_bytes, atomic_write_json, atomic_write_text, folder_writer, remove_file
from captioning.models.decoder import DecoderState
from captioning.models.encoders import Encoder
from captioning.registry import Registry
from captioning.storage.layout import CARD_FILE, CONFIG_FILE, ENCODER_ONNX, STEP_ONNX, VOCAB_FILE

OPSET = 17
ENCODER_INPUTS, ENCODER_OUTPUTS = ["images"], ["features", "projected", "h0", "c0"]
STEP_INPUTS, STEP_OUTPUTS = ["tokens", "h", "c", "features", "projected"], ["log_probs", "h_next", "c_next", "alpha"]


def _pool_matrix(size_in: int, size_out: int) -> Tensor:
    """(out, in): row i averages the inputs of adaptive pooling's bin i (floor(i*in/out) .. ceil((i+1)*in/out))."""
    m = torch.zeros(size_out, size_in)
    for i in range(size_out):
        start, end = (i * size_in) // size_out, -((-(i + 1) * size_in) // size_out)
        m[i, start:end] = 1.0 / (end - start)
    return m


class PoolAsMatmul(nn.Module):
    """AdaptiveAvgPool2d for a known input size: (B, C, H, W) -> (B, C, oh, ow) as P_h x P_w^T."""

    def __init__(self, size_in: tuple[int, int], size_out: tuple[int, int]):
        super().__init__()
        self.register_buffer("ph", _pool_matrix(size_in[0], size_out[0]))  # (oh, H)
        self.register_buffer("pwt", _pool_matrix(size_in[1], size_out[1]).t().contiguous())  # (W, ow)

    def forward(self, x: Tensor) -> Tensor:
        return torch.matmul(torch.matmul(self.ph, x), self.pwt)  # (oh, H) @ (B, C, H, W) @ (W, ow)


def exportable_encoder(encoder: Encoder, image_size: int) -> nn.Module:
    """A copy of ``encoder`` for S x S images (``Encoder.at_size``: e.g. a ViT's position embeddings
    resampled once to this size) whose adaptive poolings are fixed-size matrix products (identity
    where the grid already has the pooled size), found by running one blank image."""
    encoder = copy.deepcopy(encoder).eval().at_size(image_size)
    sizes: dict[str, tuple] = {}
    hooks = [
        m.register_forward_hook(
            lambda mod, inp, out, name=name: sizes.__setitem__(name, (inp[0].shape[-2:], out.shape[-2:]))
        )
        for name, m in encoder.named_modules()
        if isinstance(m, nn.AdaptiveAvgPool2d)
    ]
    with torch.no_grad():
        encoder(torch.zeros(1, 3, image_size, image_size))
    for h in hooks:
        h.remove()
    for name, (size_in, size_out) in sizes.items():
        parent, _, attr = name.rpartition(".")
        owner = encoder.get_submodule(parent) if parent else encoder
        replacement = (
            nn.Identity() if tuple(size_in) == tuple(size_out) else PoolAsMatmul(tuple(size_in), tuple(size_out))
        )
        setattr(owner, attr, replacement)
    return encoder


class EncoderGraph(nn.Module):
    """What depends only on the image: a, W_a a + b, and the initial state (decoder.initial_state)."""

    def __init__(self, model, image_size: int):
        super().__init__()
        self.encoder = exportable_encoder(model.encoder, image_size)
        self.decoder = model.decoder

    def forward(self, images: Tensor):
        state = self.decoder.initial_state(self.encoder(images))  # (B, 3, S, S) -> (B, L, D), normalised inside
        return state.features, state.projected, state.h, state.c  # (B, L, D), (B, L, A), 2 x (B, H)


class StepGraph(nn.Module):
    """One generation step, the decoder's own (decoder.step: its cell's step and the deep output),
    for N = B * K rows over B images; K = N / B is read from the shapes, so that the traced graph
    serves every batch size and beam count."""

    def __init__(self, decoder, mode: str = "expected", attention_temperature: float = 1.0):
        from captioning.fast import fast_decoder

        super().__init__()
        self.plain, self.decoder = decoder, fast_decoder(decoder)  # the plain module holds the parameters
        self.mode = mode
        self.attention_temperature = attention_temperature  # mode "expected": softmax(log alpha / tau)

    def forward(self, tokens: Tensor, h: Tensor, c: Tensor, features: Tensor, projected: Tensor):
        state = DecoderState(h, c, features, projected, beams=h.size(0) // features.size(0))
        log_probs, state, g = self.decoder.step(tokens, state, self.mode, self.attention_temperature)
        return log_probs, state.h, state.c, g.alpha


def _export(module: nn.Module, args: tuple, path: Path, inputs: list, outputs: list, axes: dict, opset: int) -> None:
    """Trace ``module`` to ONNX in memory, then write ``path`` atomically (files.py: a link there is
    replaced, never written through)."""
    graph = io.BytesIO()
    mha = torch.backends.mha
    fastpath = mha.get_fastpath_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        # torch's fused inference kernel of nn.TransformerEncoderLayer (the grid refiner's) has no ONNX
        # form: trace the layer's plain operations instead
        mha.set_fastpath_enabled(False)
        try:
            torch.onnx.export(
                module,
                args,
                graph,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
        finally:
            mha.set_fastpath_enabled(fastpath)
    atomic_write_bytes(path, graph.getvalue())


#: ONNX exporters by decoder kind: kind -> (export(model, spec, S, out, opset) -> config.json's
#: "onnx" section, unsupported(config) -> the settings its graphs do not reproduce, as text)
EXPORTERS = Registry("ONNX export", field="model.decoder.kind")
#: the modules of the built-in kinds' exporters besides the LSTM's (each registers itself)
BUILT_IN = ("captioning.export.onnx_transformer",)

#: the LSTM settings the ONNX step graph reproduces: any other value of these is refused in one line
#: (the catalogue's scores and windows through ``score`` and ``window``; local_width and region_size
#: only act with a window)
PAPER_ATTENTION = {
    "score": "additive",
    "heads": 1,
    "placement": "bahdanau",
    "window": "global",
    "refiner_layers": 0,
    "aoa": False,
    "normalizer": "softmax",
    "normalize": False,
    "scale": False,
    "init": "mean",
    "over_attention": False,
}


def lstm_unsupported(config) -> str:
    """The LSTM settings (attention variants) the ONNX step graph does not reproduce, as text; '' if none."""
    return ", ".join(f"{k}={getattr(config, k)!r}" for k, v in PAPER_ATTENTION.items() if getattr(config, k) != v)


def exporter(config):
    """(export, unsupported) of ``config``'s decoder kind; a one-line ConfigError for a kind without one."""
    from captioning.errors import ConfigError

    for module in BUILT_IN:
        importlib.import_module(module)
    if config.kind not in EXPORTERS:
        raise ConfigError(
            f"export --format onnx: decoder kind {config.kind!r} has no ONNX export; export a safetensors folder"
        )
    return EXPORTERS.get(config.kind)


def onnx_unsupported(config) -> str:
    """The decoder settings its kind's ONNX step graph does not reproduce, as text; '' if none."""
    return exporter(config)[1](config)


def export_onnx(model, out, card: dict | None = None, opset: int = OPSET) -> Path:
    """Write the ONNX folder of a ShowAttendTell with its ``spec`` (as storage/load.py's load_model gives
    it): encoder.onnx, decoder_step*.onnx, config.json, vocab.json, README.md. Returns the folder."""
    from captioning.errors import ConfigError
    from captioning.storage.folder import model_card, model_config

    try:
        import onnx  # noqa: F401  (torch.onnx writes the graphs through it)
    except ImportError:
        raise ConfigError("export --format onnx needs the onnx package: pip install -e '.[onnx]'") from None
    export, unsupported = exporter(model.decoder.config)
    if unsupported(model.decoder.config):
        raise ConfigError(
            f"export --format onnx: the LSTM's ONNX step graph is the paper's attention (additive score, one head, "
            f"Bahdanau placement, global, no refiner); this model has {unsupported(model.decoder.config)}: "
            "export it as a safetensors folder (the default format) instead"
        )
    out = Path(out)
    spec = model.spec
    model = copy.deepcopy(model).cpu().float().eval()
    S = int(spec.image_size)
    config = model_config(model, card, spec)
    # as storage/folder.py's save_folder: a new folder whole (a temporary sibling), an existing one
    # without its config.json until every graph is written, every file atomically
    with folder_writer(out, CheckpointError, "the ONNX folder") as folder:
        remove_file(folder / CONFIG_FILE)
        with torch.no_grad():
            config["onnx"] = {"opset": opset, "encoder": ENCODER_ONNX, **export(model, spec, S, folder, opset)}
        atomic_write_json(folder / VOCAB_FILE, model.vocab.to_dict())
        atomic_write_text(folder / CARD_FILE, model_card(config))
        atomic_write_json(folder / CONFIG_FILE, config)
    return out


B, K = 2, 3  # the example sizes the graphs are traced at, distinct so that no size is mistaken for another


def export_lstm(model, spec, S: int, out: Path, opset: int) -> dict:
    """encoder.onnx and decoder_step*.onnx of an LSTM decoder; config.json's onnx section."""
    encoder = EncoderGraph(model, S).eval()
    images = torch.rand(B, 3, S, S)
    features, projected, h0, c0 = encoder(images)
    _export(
        encoder,
        (images,),
        out / ENCODER_ONNX,
        ENCODER_INPUTS,
        ENCODER_OUTPUTS,
        {"images": {0: "images"}, **{name: {0: "images"} for name in ENCODER_OUTPUTS}},
        opset,
    )
    hard = model.attention_kind == "hard"
    modes = ("expected", "argmax") if hard else ("expected",)
    tau = float(spec.generation.attention_temperature) if hard else 1.0
    args = (
        torch.full((B * K,), 1, dtype=torch.long),
        h0.repeat_interleave(K, 0),
        c0.repeat_interleave(K, 0),
        features,
        projected,
    )
    axes = {
        "tokens": {0: "rows"},
        "h": {0: "rows"},
        "c": {0: "rows"},
        "features": {0: "images"},
        "projected": {0: "images"},
        **{name: {0: "rows"} for name in STEP_OUTPUTS},
    }
    for mode in modes:
        _export(
            StepGraph(model.decoder, mode, tau).eval(),  # the fast twin's step (captioning/fast/)
            args,
            out / STEP_ONNX[mode],
            STEP_INPUTS,
            STEP_OUTPUTS,
            axes,
            opset,
        )
    return {
        "steps": {m: STEP_ONNX[m] for m in modes},
        "attention_temperature": tau,
        "encoder_inputs": ENCODER_INPUTS,
        "encoder_outputs": ENCODER_OUTPUTS,
        "step_inputs": STEP_INPUTS,
        "step_outputs": STEP_OUTPUTS,
        "state": LSTM_STATE,
    }


EXPORTERS.add("lstm", (export_lstm, lstm_unsupported))
