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
# # 3. Local, hierarchical and multi-step attention
#
# Notebook 2 changed how locations are scored; this one changes **which locations compete** and **how many
# times the decoder attends**: Luong's placement and his local windows, hierarchical attention (cells
# within regions, then regions), attention over the words written so far (Cui et al.), a convolutional
# decoder whose every layer attends (ConvS2S), and attention pooling for the initial state. Each is an
# option of the decoder; a mechanism this version of the package does not have yet is skipped, with the
# reason.

# %% tags=["parameters"]
LANGUAGE = "en"  # the captions' language: "en", or "zh" (the Chinese notebooks)
STEPS = 300  # training steps of each model

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py lives in examples/ (this folder, or the one above it)
import numpy as np
from IPython.display import display

from captioning.api import Captioner
from notebook_tools import gif, grid, make_data, missing, scores, search_views, test_images, train

data = make_data(LANGUAGE)
images = test_images(data, 2)
trained = {}


def show(name, checkpoint):
    """Caption the first test image with the model, print its caption and scores, show its maps; the
    captioner and its result are kept in ``trained[name]``."""
    if checkpoint is None:
        return
    captioner = Captioner.from_checkpoint(checkpoint)
    [out] = captioner(images[:1], num_beams=3, return_attention=True)
    trained[name] = captioner, out
    print(f"{name}: {out['generated_text']}   {scores(captioner, data)}")
    display(grid(captioner, images[0], out))


# %% [markdown]
# ## Luong's placement: attend after the LSTM step
#
# The paper (like Bahdanau) attends from the previous state $h_{t-1}$ and feeds the context into the LSTM.
# Luong et al. (2015) attend from the new state $h_t$ and combine afterwards, into the *attentional state*
#
# $$\tilde h_t = \tanh(W_c [z_t; h_t]), \qquad p(y_t) = \operatorname{softmax}(W_s \tilde h_t).$$
#
# The context no longer feeds the recurrence (no input feeding), so the LSTM runs over the whole caption at
# once in training. Option: `--model.decoder.placement luong`.

# %%
show("luong", train("luong", STEPS, LANGUAGE, placement="luong"))

# %% [markdown]
# ## Local attention: a window around a predicted centre
#
# Global attention scores all $L$ locations. Luong's **local-p** predicts a centre $p_t$ and looks near it.
# On the 2-D grid of $g_h \times g_w$ cells the centre is a point of the grid,
#
# $$p_t = (g_h - 1, g_w - 1) \odot \sigma\big(v_p^\top \tanh(W_p h_t)\big),$$
#
# and the alignment is multiplied by a Gaussian around it, $\sigma$ in cells:
#
# $$\alpha_{ti} \propto \operatorname{align}(h_t, a_i)\, \exp\Big(-\frac{\lVert c_i - p_t \rVert^2}{2\sigma^2}\Big).$$
#
# Three versions, three options:
#
# - `window local` (with `local_sigma`, default 1.5): the product renormalised to sum to one, over the whole
#   grid, differentiable everywhere;
# - `window local_p` (with `local_width` $D$): Luong's as published: only the cells within $D$ of $p_t$
#   (the window $[p_t - D, p_t + D]$ in rows and in columns), $\operatorname{align}$ the softmax over those
#   cells only, $\sigma = D / 2$, the Gaussian multiplied in and **not** renormalised, so the weights sum to
#   less than one;
# - `window local_m`: *monotonic* alignment, the centre set by the step ($p_t = t$, the cells in reading
#   order) instead of predicted.

# %%
show("local", train("local", STEPS, LANGUAGE, window="local"))
for name, options in {"local_p": {"window": "local_p"}, "local_m": {"window": "local_m"}}.items():
    show(name, train(name, STEPS, LANGUAGE, **options))
    if name in trained:
        maps = np.asarray(trained[name][1]["attention"]).reshape(len(trained[name][1]["attention"]), -1)
        print("weights' sums per word (at most 1: not renormalised):", maps.sum(1).round(2))

# %% [markdown]
# Where the version keeps them, the search returns each step's window (`views["window"]`: its centre and
# extent) beside alpha:

# %%
if "local" in trained:
    views = search_views(trained["local"][0], images[0])
    if "window" in views:
        print("window per step (centre row, centre column, extent...):")
        print(np.asarray(views["window"]).round(2)[:6])
    else:
        print("this version does not keep the window's centre in its search")

# %% [markdown]
# ## Hierarchical attention: cells within regions, then regions
#
# Yang et al. (2016) attend over words within each sentence, then over sentences. On the grid: cut it into
# regions $R$ of $r \times r$ cells; attend within each region, then over the regions' summaries,
#
# $$\alpha_{i \mid R} = \frac{\exp(e_i)}{\sum_{k \in R} \exp(e_k)}, \quad r_R = \sum_{i \in R} \alpha_{i \mid R}\, a_i,
#   \qquad \beta_R = \operatorname{softmax}_R(e'_R), \quad z_t = \sum_R \beta_R\, r_R,$$
#
# so a cell's weight is $\beta_R\, \alpha_{i \mid R}$. Options: `window hierarchical`, `region_size` $r$.

# %%
show("hierarchical", train("hierarchical", STEPS, LANGUAGE, window="hierarchical"))

# %% [markdown]
# ## Attention over attention (Cui et al. 2017)
#
# Not to be confused with Huang et al.'s *Attention on Attention* (`aoa`, notebook 4), which gates the
# context. Cui's mechanism compares **every word read so far** with every location: the matching matrix
# $M_{ij} = \operatorname{score}(a_i, h_j)$ ($L \times t$: the locations down, the decoder's states
# $h_0 \dots h_{t-1}$ across) gets a softmax per state over the locations ($\alpha$, column-wise) and a
# softmax per location over the states ($\beta$, row-wise); the states' weights averaged over the
# locations, $\bar\beta$, weigh the states' maps into the step's map $\alpha_t$ (Cui's $s$):
#
# $$\alpha_{\cdot j} = \operatorname{softmax}(M_{\cdot j}), \quad \beta_{i \cdot} = \operatorname{softmax}(M_{i \cdot}),
#   \quad \bar\beta = \frac{1}{L}\sum_i \beta_{i \cdot}, \quad \alpha_t = \alpha\, \bar\beta^\top.$$
#
# Option: `over_attention true` (with the paper's placement, `bahdanau`).

# %%
show("over_attention", train("over_attention", STEPS, LANGUAGE, over_attention=True))

# %% [markdown]
# ## Multi-step attention: a convolutional decoder (ConvS2S)
#
# Gehring et al. (2017) replace the recurrence by gated convolutions (GLU) over the words, and **every
# layer** $l$ attends, with its own query $d_i^l = W_d^l h_i^l + b_d^l + g_i$ ($g_i$ the previous word's
# embedding):
#
# $$\alpha_{ij}^l = \frac{\exp(d_i^l \cdot z_j)}{\sum_k \exp(d_i^l \cdot z_k)}, \qquad
#   c_i^l = \sum_j \alpha_{ij}^l\, (z_j + e_j),$$
#
# so a later layer's attention already knows what the earlier layers read. Option: `--model.decoder.kind
# conv` (`configs/shapes_conv.yaml`).

# %%
why = missing(kind="conv")
if why:
    print("skipped conv:", why)
else:
    show("conv", train("conv", STEPS, LANGUAGE, config="shapes_conv.yaml", small=False))

# %% [markdown]
# ## Attention pooling for the initial state
#
# The paper starts the LSTM from the mean annotation vector, $h_0 = \tanh(W_h \frac{1}{L}\sum_i a_i)$.
# Text classifiers pool with attention instead (Yang et al. 2016): a learned query $u_w$ scores each vector,
#
# $$u_i = \tanh(W a_i + b), \qquad \alpha_i = \frac{\exp(u_i^\top u_w)}{\sum_k \exp(u_k^\top u_w)},
#   \qquad h_0 = \tanh\Big(W_h \sum_i \alpha_i a_i\Big).$$
#
# Option: `init attention_pool`.

# %%
show("attention_pool", train("attention_pool", STEPS, LANGUAGE, init="attention_pool"))

# %% [markdown]
# ## The trained models side by side
#
# The GIF of each model on the same image, one frame per word:

# %%
for name, (captioner, _) in trained.items():
    [out] = captioner(images[1:2], num_beams=3, return_attention=True)
    print(name, "->", out["generated_text"])
    display(gif(captioner, images[1], out))
