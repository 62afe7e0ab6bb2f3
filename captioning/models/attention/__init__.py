"""The attention variants of the LSTM decoder, one file each; models/decoder.py is the paper's model.

Each file registers its option's name where it is defined (models/decoder.py's registries) or is
built by the decoder when its option is set:

- dot.py: the scores ``dot``, ``general``, ``scaled_dot`` (Luong et al. 2015, Vaswani et al. 2017)
- heads.py: several heads (``heads``), their contexts joined by W_o
- local.py: the window ``local`` (Luong's local-p on the 2-D grid)
- luong.py: the placement ``luong`` (attention from h_t, the attentional state in Eq. 7)
- aoa.py: Attention on Attention over the context (``aoa``; Huang et al. 2019)
- refiner.py: self-attention over the grid before decoding (``refiner_layers``)
"""

from captioning.models.attention import dot, local, luong  # noqa: F401 (register their names)
