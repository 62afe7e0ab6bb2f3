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
# # 1. The paper's soft and hard attention
#
# *Show, Attend and Tell* (Xu et al., ICML 2015) captions an image word by word, and before each word it
# decides **where to look**. This notebook trains the paper's two models on synthetic shapes for a few
# minutes on a CPU and opens them up: the annotation vectors, the scores, the weights alpha, the context,
# the gate beta, and hard attention's sampled location.
#
# Everything here runs on data the notebook makes itself. Run it from `examples/` of the repository
# (`pip install -e ".[dev]"` first, or `make test` once, which installs everything).

# %% tags=["parameters"]
LANGUAGE = "en"  # the captions' language: "en", or "zh" (the Chinese notebooks)
STEPS = 600  # training steps of each model; more steps, better captions and maps

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py lives in examples/ (this folder, or the one above it)
import numpy as np
from IPython.display import Image, display

from captioning.api import Captioner
from notebook_tools import gif, grid, make_data, matrix, scores, search_views, test_images, train, words

data = make_data(LANGUAGE)
images = test_images(data, 4)
display(Image(filename=images[0], width=160))

# %% [markdown]
# ## The encoder: an image becomes L annotation vectors
#
# A CNN turns the image into a grid of $g_h \times g_w = L$ cells, each a vector $a_i \in \mathbb{R}^D$
# (the paper: VGG's conv5, $14 \times 14 \times 512$; here a small CNN trained from scratch, $8 \times 8$
# cells of $D = 128$):
#
# $$a = \{a_1, \dots, a_L\}, \quad a_i \in \mathbb{R}^D.$$
#
# ## The decoder: an LSTM that attends before every word
#
# At step $t$ the LSTM's previous state $h_{t-1}$ scores every location with a small network
# $f_{\text{att}}$ (the paper's Eq. 4, Bahdanau's *additive* score), and a softmax turns the scores into
# weights that sum to one (Eq. 5):
#
# $$e_{ti} = f_{\text{att}}(a_i, h_{t-1}) = w^\top \tanh(W_a a_i + W_h h_{t-1}), \qquad
#   \alpha_{ti} = \frac{\exp(e_{ti})}{\sum_{k=1}^{L} \exp(e_{tk})}.$$
#
# **Soft attention** reads the expected annotation vector, a weighted mean (Eq. 13), scaled by a gate
# $\beta_t$ that lets the model say "this word needs little of the image" (Section 4.2.1):
#
# $$\hat z_t = \beta_t \sum_{i=1}^{L} \alpha_{ti}\, a_i, \qquad \beta_t = \sigma(f_\beta(h_{t-1})).$$
#
# The LSTM reads $[E y_{t-1};\, h_{t-1};\, \hat z_t]$ and the next word comes from the *deep output*
# $p(y_t) \propto \exp(L_o(E y_{t-1} + L_h h_t + L_z \hat z_t))$ (Eq. 7). Everything is differentiable:
# the model trains by back-propagation on $-\log p(y)$, plus the **doubly stochastic** penalty
# $\lambda \sum_i (1 - \sum_t \alpha_{ti})^2$ that asks every location to be looked at about once over
# the caption (Eq. 14). The code is these equations: `captioning/models/decoder.py`.
#
# `captioning fit --config configs/shapes_soft.yaml` trains it; `train()` below runs the same command
# with a smaller model and a fixed number of steps (`--model.decoder.*` options as keywords).

# %%
soft_checkpoint = train("soft", STEPS, LANGUAGE)
soft = Captioner.from_checkpoint(soft_checkpoint)
results = soft(images, num_beams=3, return_attention=True)
for path, out in zip(images, results):
    print(path.rsplit("/", 1)[-1], "->", out["generated_text"])

# %% [markdown]
# Each word comes with its map $\alpha_t$, one weight per cell: `out["attention"]` has shape
# $(T, g_h, g_w)$ and every map sums to one. The GIF shows them one word a frame:

# %%
first = results[0]
alpha = np.asarray(first["attention"])
print("maps:", alpha.shape, " sums:", alpha.reshape(len(alpha), -1).sum(1).round(4))
gif(soft, images[0], first)

# %% [markdown]
# The same maps as the alignment matrix of the machine-translation papers: a row per word, a column per
# location (the $L$ cells in reading order). A sharp row is a word that looked at one place; a flat row
# read the whole image.

# %%
T = len(words(first))
matrix(alpha.reshape(len(alpha), -1)[:T], words(first))

# %% [markdown]
# How sharp is each word's map? The entropy $-\sum_i \alpha_{ti} \log \alpha_{ti}$ is $\log L$ for a
# uniform map and 0 for one cell. Object words (shapes, colours) should look at their object; words like
# "a" or "of" need not look anywhere in particular.

# %%
L = alpha[0].size
for word, m in zip(words(first), alpha.reshape(len(alpha), -1)):
    entropy = float(-(m * np.log(m + 1e-12)).sum())
    row, col = np.unravel_index(m.argmax(), alpha.shape[1:])
    print(f"{word:>10}  entropy {entropy:4.2f} of {np.log(L):.2f}   peak at cell (row {row}, column {col})")

# %% [markdown]
# ### The gate $\beta_t$
#
# The search keeps what each step showed beside alpha: the gate is `views["gate"]` of `model.generate`
# (where this version of the package records it).

# %%
views = search_views(soft, images[0])  # greedy search: its words can differ from the beams' above
if "gate" in views:
    for t, b in enumerate(views["gate"].reshape(len(views["gate"]), -1)[: len(words(first)), 0]):
        print(f"step {t:2d}  beta {b:.2f}")
else:
    print("this version of the package does not keep the gate beta_t in its search")

# %% [markdown]
# ### Where did the whole caption look?
#
# $\sum_t \alpha_{ti}$ per location: the doubly stochastic penalty pushes it towards 1 everywhere (the
# shapes recipe turns the penalty off, `doubly_stochastic: 0.0`, and the total follows the objects).

# %%
total = alpha[:T].sum(0)
print(np.array2string(total, precision=1, suppress_small=True))

# %% [markdown]
# ## Hard attention: sample one location
#
# Hard attention reads **one** annotation vector, sampled from alpha (Eq. 8-9):
#
# $$s_t \sim \text{Multinoulli}_L(\{\alpha_{ti}\}), \qquad \hat z_t = a_{s_t}.$$
#
# Sampling is not differentiable, so the paper maximises a lower bound of $\log p(y \mid a)$,
# $L_s = \sum_s p(s \mid a) \log p(y \mid s, a)$, whose gradient is estimated from sampled locations
# (REINFORCE, Eq. 10-12), with a moving-average baseline $b$ and an entropy bonus:
#
# $$\frac{\partial L_s}{\partial W} \approx \frac{1}{N}\sum_{n=1}^{N}\Big[
#   \frac{\partial \log p(y \mid \tilde s^n, a)}{\partial W}
#   + \lambda_r \big(\log p(y \mid \tilde s^n, a) - b\big) \frac{\partial \log p(\tilde s^n \mid a)}{\partial W}
#   + \lambda_e \frac{\partial H[\tilde s^n]}{\partial W} \Big].$$
#
# With probability 0.5 a caption is trained on the expected context instead (the paper's
# semi-sampling). `configs/shapes_hard.yaml` is this objective (`HardAttentionReinforce`).

# %%
hard_checkpoint = train("hard", STEPS, LANGUAGE, config="shapes_hard.yaml")
hard = Captioner.from_checkpoint(hard_checkpoint)
[hard_out] = hard(images[:1], num_beams=3, return_attention=True)
print(hard_out["generated_text"])
print("chosen cells:", hard_out["locations"][: len(words(hard_out))])
gif(hard, images[0], hard_out)

# %% [markdown]
# The GIF outlines the cell the model read for each word, over its faint soft map. A hard model decodes in
# one of three modes (`attention_mode`): `expected` (the soft context of its alpha, the default), `argmax`
# (the most likely cell) or `sample` (a cell drawn from alpha, a different one each time):

# %%
for mode in ("expected", "argmax", "sample", "sample"):
    [out] = hard(images[:1], num_beams=1, attention_mode=mode, return_attention=True)
    print(f"{mode:>8}: {out['generated_text']}   cells {out['locations'][:4]}")

# %% [markdown]
# ## Soft against hard, on the test images
#
# Object F1: does the caption name the right (size, colour, shape) objects? Pointing game: how often a shape
# word's map peaks inside that object's box (a uniform map scores about 0.07). After a few hundred steps
# both are far from the trained figures of the README (`make demo` trains 1,200 steps of the full-size
# model): raise `STEPS` to see them climb.

# %%
for name, captioner in (("soft", soft), ("hard", hard)):
    print(name, scores(captioner, data))

# %% [markdown]
# ## What next
#
# - `grid(soft, images[1], results[1])` draws a panel per word instead of a GIF.
# - `captioning attend IMAGE --checkpoint CKPT --out maps.gif` draws the same pictures from the command
#   line, `captioning serve --checkpoint CKPT` on a web page.
# - Notebook 2 changes the score $f_{\text{att}}$ and the softmax; notebook 3 restricts where the model may
#   look; notebook 4 replaces the LSTM by self-attention.

# %%
grid(soft, images[1], results[1])
