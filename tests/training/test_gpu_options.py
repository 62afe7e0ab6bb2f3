"""The GPU-oriented options (bf16 autocast, channels-last encoder, compiled decoder step) on the CPU:
they train, they save a usable checkpoint, and they compute what the plain path computes."""

import math
from pathlib import Path

import pytest
import torch

from captioning.decoding.search import GenerationConfig
from captioning.models.decoder import DecoderConfig, ShowAttendTellDecoder
from captioning.models.encoders import EncoderConfig, build_encoder
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.storage.load import load_model
from captioning.training.cli import run_lightning_cli
from tests.helpers import fit_args


@pytest.mark.parametrize("config", ["shapes_soft.yaml", "shapes_hard.yaml"])
def test_bf16_and_channels_last_fit_and_checkpoint(config, tiny_shapes, tmp_path):
    extra = ["--trainer.precision", "bf16-mixed", "--model.encoder.channels_last", "true"]
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, config=config, steps=3, extra=extra))
    assert cli.trainer.global_step == 3
    loss = cli.trainer.callback_metrics["train/loss"]
    assert math.isfinite(float(loss))
    model = load_model(Path(cli.trainer.checkpoint_callback.last_model_path))
    assert model.spec.encoder.channels_last and model.encoder.channels_last
    out = model.generate(images=torch.rand(2, 3, 64, 64), config=GenerationConfig(num_beams=2))
    assert out.sequences.shape[0] == 2


def test_channels_last_encoder_computes_the_same_features():
    torch.manual_seed(0)
    plain = build_encoder(EncoderConfig("small_cnn")).eval()
    fast = build_encoder(EncoderConfig("small_cnn", channels_last=True)).eval()
    fast.load_state_dict(plain.state_dict())
    images = torch.rand(3, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(fast(images), plain(images), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compiled_decoder_step_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    B, T, L, D, V = 6, 7, 16, 24, 30
    plain = ShowAttendTellDecoder(V, D, DecoderConfig(16, 32, 16, dropout=0.0))
    compiled = ShowAttendTellDecoder(V, D, DecoderConfig(16, 32, 16, dropout=0.0, compile_step=True))
    compiled.load_state_dict(plain.state_dict())
    features = torch.randn(B, L, D)
    lengths = torch.tensor([8, 7, 5, 8, 3, 6])
    captions = torch.randint(3, V, (B, T + 1))
    captions[torch.arange(T + 1).unsqueeze(0) >= lengths.unsqueeze(1)] = 0

    def loss_and_grads(decoder):
        out = decoder(features, captions, lengths)
        loss = -caption_log_likelihood(out.logits, captions[:, 1:], out.mask).mean()
        grads = torch.autograd.grad(loss, list(decoder.parameters()))
        return loss, grads

    loss_a, grads_a = loss_and_grads(plain)
    loss_b, grads_b = loss_and_grads(compiled)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-4, atol=1e-5)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)
