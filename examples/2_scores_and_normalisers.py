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
# # 2. Score functions and normalisers
#
# Every attention mechanism of the course notes has the same two steps: **score** each location against
# the decoder's state, then **normalise** the scores into weights. This notebook trains one model per score
# function on the same data, for the same number of steps, and looks at what each one attends to; then it
# puts the softmax beside sparsemax, which can give a location exactly zero weight.
#
# Notation as in notebook 1: annotation vectors $a_i \in \mathbb{R}^D$ ($i = 1..L$), the decoder's state
# $h \in \mathbb{R}^H$, scores $e_i$, weights $\alpha_i$, context $z = \sum_i \alpha_i a_i$.

# %% tags=["parameters"]
LANGUAGE = "en"  # the captions' language: "en", or "zh" (the Chinese notebooks)
STEPS = 300  # training steps of each model

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py lives in examples/ (this folder, or the one above it)
import numpy as np

from captioning.api import Captioner
from notebook_tools import grid, make_data, missing, scores, test_images, train

data = make_data(LANGUAGE)
images = test_images(data, 2)

# %% [markdown]
# ## The score functions
#
# | mechanism | score $e_i$ | option |
# |---|---|---|
# | additive (Bahdanau et al. 2015; the paper's Eq. 4) | $v^\top \tanh(W_a a_i + W_h h)$ | `--model.decoder.score additive` (default) |
# | concat (Luong et al. 2015) | $v^\top \tanh(W [h; a_i])$ | `score concat` |
# | dot (Luong) | $h^\top a_i$ (needs $H = D$) | `score dot` |
# | general (Luong) | $h^\top W a_i$ | `score general` |
# | scaled dot product (Vaswani et al. 2017) | $(W_q h)^\top (W_k a_i) / \sqrt{d}$ | `score scaled_dot` |
# | normalised Bahdanau (TensorFlow's `normalize=True`) | $g \frac{v^\top}{\lVert v \rVert} \tanh(W_a a_i + W_h h + b)$ | `normalize true` |
# | scaled Luong (TensorFlow's `scale=True`) | $g\, h^\top W a_i$, $g$ a learned scalar | `score general` + `scale true` |
# | none: one fixed context | $\alpha_i = 1/L$ for every word | `score uniform` |
#
# Additive and concat are the same family: $W [h; a_i] = W_h h + W_a a_i$, a one-layer network over both.
# Dot and general are bilinear: cheaper (one product per location), and dot has no parameters at all. The
# scaled dot product divides by $\sqrt{d}$ so that the scores' spread does not grow with the width.
#
# **The uniform score is the encoder-decoder without attention**: every word reads the same mean vector
# $\bar a = \frac{1}{L}\sum_i a_i$, so the whole image must pass through one fixed-size context. That is
# the bottleneck that attention removes, and the baseline each mechanism should beat.
#
# Each model below is the notebook's small model with one option changed. A mechanism this version of the
# package does not have yet is skipped, with the reason.

# %%
MECHANISMS = {
    "additive": {},
    "concat": {"score": "concat"},
    "dot": {"score": "dot"},
    "general": {"score": "general"},
    "scaled_dot": {"score": "scaled_dot"},
    "normalized additive": {"normalize": True},
    "scaled general": {"score": "general", "scale": True},
    "uniform": {"score": "uniform"},
}
captioners = {}
for name, options in MECHANISMS.items():
    checkpoint = train(name.replace(" ", "_"), STEPS, LANGUAGE, **options)
    if checkpoint is not None:
        captioners[name] = Captioner.from_checkpoint(checkpoint)

# %% [markdown]
# The same test image through each model: its caption and one panel per word. Compare how sharp the maps
# are, and whether the shape words land on their shapes.

# %%
results = {}
for name, captioner in captioners.items():
    [out] = captioner(images[:1], num_beams=3, return_attention=True)
    results[name] = out
    print(f"{name:>20}: {out['generated_text']}")

# %%
from IPython.display import display

for name, captioner in captioners.items():
    print(name)
    display(grid(captioner, images[0], results[name]))

# %% [markdown]
# ## On the whole test split
#
# Object F1 (the caption names the right objects) and the pointing game (a shape word's map peaks in its
# object's box; a uniform map scores about 0.07), beside the maps' mean entropy in nats (uniform:
# $\log L$). A few hundred steps rank the mechanisms only roughly: the figures move with the seed.

# %%
print(f"{'mechanism':>20}  object F1  pointing  entropy")
for name, captioner in captioners.items():
    s = scores(captioner, data)
    maps = np.asarray(results[name]["attention"]).reshape(len(results[name]["attention"]), -1)
    entropy = float(-(maps * np.log(maps + 1e-12)).sum(1).mean())
    pointing = "-" if s["pointing game"] is None else f"{s['pointing game']:.3f}"  # -: no shape word named
    print(f"{name:>20}  {s['object F1']:9.3f}  {pointing:>8}  {entropy:7.2f}")

# %% [markdown]
# ## The normaliser: softmax or sparsemax
#
# The softmax gives every location some weight:
# $\operatorname{softmax}(e)_i = \exp(e_i) / \sum_k \exp(e_k) > 0$.
# **Sparsemax** (Martins and Astudillo 2016) is the Euclidean projection of the scores onto the simplex,
#
# $$\operatorname{sparsemax}(e) = \operatorname*{arg\,min}_{p \in \Delta^{L-1}} \lVert p - e \rVert^2
#   = \big[e_i - \tau(e)\big]_+ ,$$
#
# with the threshold $\tau$ from the sorted scores $e_{(1)} \ge e_{(2)} \ge \dots$:
# $k(e) = \max\{k : 1 + k\, e_{(k)} > \sum_{j \le k} e_{(j)}\}$ and
# $\tau(e) = \big(\sum_{j \le k(e)} e_{(j)} - 1\big) / k(e)$.
# Locations scored below $\tau$ get exactly zero: a map with a support.


# %%
def softmax(e):
    e = np.exp(e - e.max())
    return e / e.sum()


def sparsemax(e):
    z = np.sort(e)[::-1]
    k = np.arange(1, len(e) + 1)
    support = 1 + k * z > np.cumsum(z)
    tau = (np.cumsum(z)[support][-1] - 1) / k[support][-1]
    return np.maximum(e - tau, 0.0)


e = np.array([2.0, 1.5, 0.3, 0.1, -1.0, -2.0])
print("scores   ", e)
print("softmax  ", softmax(e).round(3), " zeros:", int((softmax(e) == 0).sum()))
print("sparsemax", sparsemax(e).round(3), " zeros:", int((sparsemax(e) == 0).sum()), " sum:", sparsemax(e).sum())

# %% [markdown]
# Scaling the scores up sharpens both, but only sparsemax reaches exact zeros (and, far enough, a single
# location: hard attention's one-hot map, reached without sampling):

# %%
for scale in (0.5, 1, 2, 4):
    print(f"x{scale:<3} softmax {softmax(scale * e).round(2)}   sparsemax {sparsemax(scale * e).round(2)}")

# %% [markdown]
# `--model.decoder.normalizer sparsemax` trains the decoder with it (Eq. 5 with sparsemax in place of the
# softmax). Where this version has it, the package's sparsemax must equal the closed form above:

# %%
why = missing(normalizer="sparsemax")
if why:
    print("skipped sparsemax:", why)
else:
    import torch

    from captioning.models.decoder import NORMALIZERS

    theirs = NORMALIZERS.get("sparsemax")(torch.tensor(e, dtype=torch.float64)[None])[0].numpy()
    print("package  ", theirs.round(3), " equal to the closed form:", np.allclose(theirs, sparsemax(e)))
    checkpoint = train("sparsemax", STEPS, LANGUAGE, normalizer="sparsemax")
    sparse = Captioner.from_checkpoint(checkpoint)
    [out] = sparse(images[:1], num_beams=3, return_attention=True)
    maps = np.asarray(out["attention"]).reshape(len(out["attention"]), -1)
    print(out["generated_text"])
    print("share of exactly-zero weights per word:", (maps == 0).mean(1).round(2))
    display(grid(sparse, images[0], out))

# %% [markdown]
# ## What next
#
# - Train longer (`STEPS`) or with another seed (`train(..., seed=1)`) and see which differences stay.
# - `captioning compare-attention IMAGE --checkpoints A B --labels a b --out DIR` draws several models'
#   maps side by side from the command line.
# - Notebook 3: where the model may look (local windows, regions) and attending several times.
