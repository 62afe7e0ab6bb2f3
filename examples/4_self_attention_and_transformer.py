# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. Self-attention and the Transformer
#
# The attention of notebooks 1-3 lets a decoder state look at the image. **Self-attention** lets a sequence
# look at itself: each word at the words before it, each image cell at every other cell. Stacked with
# several heads, positions and feed-forward layers, it is the Transformer (Vaswani et al. 2017), which
# replaces the LSTM altogether. This notebook trains a multi-head LSTM, an LSTM whose grid is first refined
# by self-attention, and a Transformer decoder, and draws their attention matrices.

# %% tags=["parameters"]
LANGUAGE = "en"  # the captions' language: "en", or "zh" (the Chinese notebooks)
STEPS = 300  # training steps of each model

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py lives in examples/ (this folder, or the one above it)
import numpy as np
from IPython.display import display

from captioning.api import Captioner
from notebook_tools import (
    gif,
    grid,
    grid_self_attention,
    make_data,
    matrix,
    scores,
    test_images,
    train,
    word_self_attention,
    words,
)

data = make_data(LANGUAGE)
images = test_images(data, 2)

# %% [markdown]
# ## Scaled dot-product attention
#
# Queries $Q$ ($n \times d_k$), keys $K$ ($m \times d_k$) and values $V$ ($m \times d_v$): every query is
# compared with every key, and reads the values with the weights (Vaswani et al., Eq. 1):
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\Big(\frac{Q K^\top}{\sqrt{d_k}}\Big) V.$$
#
# The LSTM's `score scaled_dot` is this with one query, the state. **Multi-head** attention runs $h$ of
# them side by side on learned projections and joins the results:
#
# $$\operatorname{head}_j = \operatorname{Attention}(Q W_j^Q, K W_j^K, V W_j^V), \qquad
#   \operatorname{MultiHead}(Q, K, V) = [\operatorname{head}_1; \dots; \operatorname{head}_h]\, W^O.$$
#
# In the LSTM decoder: `--model.decoder.heads 4` (each head its own map over the grid; the pictures show
# their mean, or each head with `heads="each"`).

# %%
multihead = Captioner.from_checkpoint(train("multihead", STEPS, LANGUAGE, heads=4))
[out] = multihead(images[:1], num_beams=3, return_attention=True)
print(out["generated_text"], "  heads' maps:", np.asarray(out["head_attention"]).shape)
gif(multihead, images[0], out, heads="each")

# %% [markdown]
# ## Self-attention over the grid: the refiner
#
# Before decoding, `refiner_layers` Transformer encoder layers let every cell attend to every cell
# ($Q = K = V = $ the annotation vectors, plus 2-D sinusoidal positions, since attention by itself does
# not know where a cell is):
#
# $$a' = a + \operatorname{MultiHead}(\operatorname{LN}(a), \operatorname{LN}(a), \operatorname{LN}(a)),
#   \qquad a'' = a' + \operatorname{FFN}(\operatorname{LN}(a')).$$
#
# A cell of a shape can gather the rest of its shape, or its neighbour's colour. Option:
# `--model.decoder.refiner_layers 1`. Below: the first layer's cell-by-cell weights, one row per cell (the
# $L$ cells in reading order), averaged over the heads.

# %%
refined = Captioner.from_checkpoint(train("refiner", STEPS, LANGUAGE, refiner_layers=1))
[out] = refined(images[:1], num_beams=3, return_attention=True)
print(out["generated_text"], scores(refined, data))
cells = grid_self_attention(refined, images[0])
print("grid self-attention:", cells.shape, "(heads, cells, cells)")
rows = [str(i) if i % 8 == 0 else "" for i in range(cells.shape[1])]  # the first cell of each row of the grid
matrix(cells.mean(0), rows, cell=6)

# %% [markdown]
# ## The Transformer decoder
#
# `decoder.kind: transformer` replaces the LSTM by $N$ layers, each
#
# 1. **masked self-attention** over the words so far: word $t$ attends to words $1..t$ only (the scores of
#    later words are set to $-\infty$ before the softmax), so training can run every position at once;
# 2. **cross-attention** over the grid: the words are the queries, the annotation vectors (projected to the
#    model's width, with 2-D positions) the keys and values; these are the maps the GIFs draw;
# 3. a position-wise feed-forward network, $\operatorname{FFN}(x) = W_2 \max(0, W_1 x + b_1) + b_2$,
#
# each inside a residual connection with layer normalisation first (pre-LN). Words get sinusoidal
# positions, $PE_{(p, 2i)} = \sin(p / 10000^{2i/d})$, $PE_{(p, 2i+1)} = \cos(p / 10000^{2i/d})$.
# `configs/shapes_transformer.yaml`: 2 layers of 4 heads, width 128.

# %%
transformer = Captioner.from_checkpoint(
    train(
        "transformer",
        STEPS,
        LANGUAGE,
        config="shapes_transformer.yaml",
        small=False,
        **{"model.encoder.dim": 128, "data.batch_size": 48, "model.optimizer.ema_start_step": 10_000},
    )
)
results = transformer(images, num_beams=3, return_attention=True)
for path, out in zip(images, results):
    print(path.rsplit("/", 1)[-1], "->", out["generated_text"])
print(scores(transformer, data))
gif(transformer, images[0], results[0])

# %% [markdown]
# The GIF shows the cross-attention (the mean over the layers: `attention_layer: mean`). The words'
# **self-attention** is a lower-triangular matrix per layer and head: row $t$ is what word $t$ read of
# the words before it (the first column is the start token).

# %%
first = results[0]
layers = word_self_attention(transformer, images[0], first)
labels = ["<start>", *words(first)]
for number, weights in enumerate(layers):
    print(
        f"layer {number}: {weights.shape[0]} heads; above the diagonal (later words):",
        float(np.triu(weights.mean(0), 1).sum()),
    )
    display(matrix(weights.mean(0)[: len(labels), : len(labels)], labels, labels))

# %% [markdown]
# ## Attention on Attention (Huang et al. 2019)
#
# `--model.decoder.aoa true` (LSTM or Transformer) gates the attended vector $\hat v$ with the query $q$
# that asked for it, so that a context the query does not need can be switched off:
#
# $$i = W_i [\hat v; q] + b_i, \qquad g = \sigma(W_g [\hat v; q] + b_g), \qquad \operatorname{AoA}(\hat v, q) = g \odot i.$$
#
# This is Huang's *Attention on Attention*, not Cui's *attention-over-attention* (notebook 3,
# `over_attention`), which weighs the maps of the words so far.

# %%
grid(transformer, images[1], results[1])
