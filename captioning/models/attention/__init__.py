"""The attention variants of the LSTM decoder, one file each; models/decoder.py is the paper's model.

Each file registers its option's name where it is defined (models/decoder.py's registries) or is
built by the decoder when its option is set (docs/CATALOGUE.md lists them with their equations):

- dot.py: the scores ``dot``, ``general``, ``scaled_dot`` (Luong et al. 2015, Vaswani et al. 2017)
- uniform.py, concat.py: the scores ``uniform`` (no attention: alpha = 1/L) and ``concat`` (Luong's)
- normalized.py, scaled.py: ``normalize`` (weight-normalised v, learned g) and ``scale`` (learned g)
- sparsemax.py: the normaliser ``sparsemax`` (Martins and Astudillo 2016) beside softmax
- heads.py: several heads (``heads``), their contexts joined by W_o
- local.py: the window ``local`` (Luong's local-p on the 2-D grid, renormalised)
- local_p.py: the windows ``local_p`` and ``local_m`` (Luong's local attention as published)
- hierarchical.py: the window ``hierarchical`` (cells within regions, then regions; Yang et al. 2016)
- luong.py: the placement ``luong`` (attention from h_t, the attentional state in Eq. 7)
- aoa.py: Attention on Attention over the context (``aoa``; Huang et al. 2019)
- over_attention.py: attention-over-attention (``over_attention``; Cui et al. 2017)
- pooling.py: the initial state from attention pooling (``init: attention_pool``)
- refiner.py: self-attention over the grid before decoding (``refiner_layers``)
"""

from captioning.models.attention import (  # noqa: F401 (register their names)
    concat,
    dot,
    hierarchical,
    local,
    local_p,
    luong,
    sparsemax,
    uniform,
)
