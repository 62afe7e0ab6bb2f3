"""The whole captioner as one plain ``nn.Module``: encoder, decoder and the vocabulary they write in.

It knows nothing of Lightning: training wiring lives in training/module.py, and everything that
only captions (the API, evaluation, tools) uses this class. :func:`captioning.models.spec.build_model`
builds it from a :class:`~captioning.models.spec.ModelSpec`, and
:func:`captioning.storage.load.load_model` from a checkpoint or model folder.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from captioning.decoding.generation import bad_ending_ids
from captioning.decoding.search import GenerationConfig, GenerationOutput, generate
from captioning.models.decoder import DecoderOutput
from captioning.models.encoders import EncoderConfig, build_encoder
from captioning.models.kinds import build_decoder, decoder_config
from captioning.vocab import Vocabulary


class ShowAttendTell(nn.Module):
    """Images (B, 3, S, S) in [0, 1] -> annotation vectors (B, L, D) -> captions in ``vocab``.

    ``spec``: the :class:`~captioning.models.spec.ModelSpec` it was built from (kept as ``self.spec``;
    :func:`~captioning.models.spec.build_model` passes it). The decoder is of the kind
    ``decoder.kind`` names (models/decoder.py: ``DECODERS``) and knows the vocabulary's bad endings
    (``decoder.bad_ending_ids``), so that every model can decode with ``GenerationConfig.forbid_bad_endings``.
    ``source`` and ``card`` are set by :func:`~captioning.storage.load.load_model` (where the model
    was read from; what its model card says), None for a model built here.
    """

    def __init__(self, encoder: EncoderConfig, decoder, vocab: Vocabulary, spec=None):
        super().__init__()
        self.vocab = vocab
        self.spec = spec
        #: where load_model read the model (a storage.checkpoint.ModelSource), None if built here
        self.source: Any = None
        #: the model card load_model read (training_data, global_step, scores, training...), None if built here
        self.card: dict | None = None
        self.encoder = build_encoder(encoder)
        self.decoder = build_decoder(len(vocab), self.encoder.out_dim, decoder_config(decoder))
        self.decoder.bad_ending_ids = bad_ending_ids(vocab)  # for GenerationConfig.forbid_bad_endings

    @property
    def attention_kind(self) -> str:
        return self.decoder.attention_kind

    def train(self, mode: bool = True) -> ShowAttendTell:
        """Train mode, except that frozen batch-norm layers keep their ImageNet statistics."""
        super().train(mode)
        for m in self.encoder.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and not any(p.requires_grad for p in m.parameters()):
                m.eval()
        return self

    def features(self, batch: dict) -> Tensor:
        """Annotation vectors (B, L, D) of a batch: its cached ``features``, or its ``images`` encoded.

        A batch grouped by image (``image_index``: the image row of each caption) is encoded once
        per image, then each caption gets its image's vectors: (B_img, L, D) -> (N, L, D).
        """
        features = batch["features"].float() if "features" in batch else self.encoder(batch["images"])
        if "image_index" in batch:
            features = features[batch["image_index"]]
        return features

    def forward(self, features: Tensor, captions: Tensor, lengths: Tensor, **kwargs) -> DecoderOutput:
        """The teacher-forced pass of the decoder (models/decoder.py: ShowAttendTellDecoder.forward)."""
        return self.decoder(features, captions, lengths, **kwargs)

    @torch.no_grad()
    def generate(
        self,
        images: Tensor | None = None,
        features: Tensor | None = None,
        config: GenerationConfig = GenerationConfig(),
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Captions of images (B, 3, S, S) in [0, 1], or of their annotation vectors (B, L, D)."""
        if features is None:
            features = self.encoder(images)
        return generate(self.decoder, features, config, generator)

    def decode_text(self, sequences: Tensor) -> list[str]:
        """The words of each row of token ids (B, T), up to EOS."""
        return [self.vocab.decode_text(row) for row in sequences.tolist()]
