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
# # 3. 局部注意力、层次注意力与多步注意力
#
# 笔记本 2 改变的是位置如何打分；本笔记本改变的是**哪些位置参与竞争**以及**解码器注意几次**：Luong 的注意力位置与他的局部窗口、层次注意力（先在区域内的单元之间，再在区域之间）、对已写出的词做的注意力（Cui 等）、每一层都做注意力的卷积解码器（ConvS2S），以及用注意力池化得到初始状态。每一种都是解码器的一个选项；当前版本的代码包还没有的机制会被跳过，并说明原因。

# %% tags=["parameters"]
LANGUAGE = "zh"  # 描述的语言："zh"（中文），或 "en"（英文笔记本）
STEPS = 300  # 每个模型的训练步数

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py 在 examples/ 里（本文件夹或上一级）
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
# ## Luong 的位置：在 LSTM 这一步之后做注意力
#
# 论文（与 Bahdanau 一样）用上一步的状态 $h_{t-1}$ 做注意力，并把上下文送进 LSTM。Luong 等（2015）用新的状态 $h_t$ 做注意力，之后再组合成**注意力隐状态**：
#
# $$\tilde h_t = \tanh(W_c [z_t; h_t]), \qquad p(y_t) = \operatorname{softmax}(W_s \tilde h_t).$$
#
# 上下文不再进入循环（没有 input feeding），所以训练时 LSTM 可以一次跑完整句描述。选项：`--model.decoder.placement luong`。

# %%
show("luong", train("luong", STEPS, LANGUAGE, placement="luong"))

# %% [markdown]
# ## 局部注意力：围绕预测中心的窗口
#
# 全局注意力给全部 $L$ 个位置打分。Luong 的 **local-p** 预测一个中心 $p_t$，只看它附近。在 $g_h \times g_w$ 的二维网格上，中心是网格中的一个点：
#
# $$p_t = (g_h - 1, g_w - 1) \odot \sigma\big(v_p^\top \tanh(W_p h_t)\big),$$
#
# 对齐分数乘以以它为中心的高斯函数（$\sigma$ 以单元为单位）：
#
# $$\alpha_{ti} \propto \operatorname{align}(h_t, a_i)\, \exp\Big(-\frac{\lVert c_i - p_t \rVert^2}{2\sigma^2}\Big).$$
#
# 三个版本，三个选项：
#
# - `window local`（配合 `local_sigma`，默认 1.5）：乘积在整个网格上重新归一化为和为 1，处处可微；
# - `window local_p`（配合 `local_width` $D$）：Luong 论文中的原版：只保留距 $p_t$ 不超过 $D$ 的单元（行和列各取窗口 $[p_t - D, p_t + D]$），$\operatorname{align}$ 只在这些单元上做 softmax，$\sigma = D / 2$，乘上高斯函数后**不**重新归一化，所以权重之和小于 1；
# - `window local_m`：**单调**对齐，中心由步数决定（$p_t = t$，单元按阅读顺序），而不是预测出来的。

# %%
show("local", train("local", STEPS, LANGUAGE, window="local"))
for name, options in {"local_p": {"window": "local_p"}, "local_m": {"window": "local_m"}}.items():
    show(name, train(name, STEPS, LANGUAGE, **options))
    if name in trained:
        maps = np.asarray(trained[name][1]["attention"]).reshape(len(trained[name][1]["attention"]), -1)
        print("weights' sums per word (at most 1: not renormalised):", maps.sum(1).round(2))

# %% [markdown]
# 在保留窗口信息的版本中，搜索会在 alpha 之外返回每一步的窗口（`views["window"]`：中心和范围）：

# %%
if "local" in trained:
    views = search_views(trained["local"][0], images[0])
    if "window" in views:
        print("window per step (centre row, centre column, extent...):")
        print(np.asarray(views["window"]).round(2)[:6])
    else:
        print("this version does not keep the window's centre in its search")

# %% [markdown]
# ## 层次注意力：先在区域内，再在区域之间
#
# Yang 等（2016）先在每个句子内对词做注意力，再对句子做注意力。在网格上：把它切成 $r \times r$ 个单元组成的区域 $R$；先在每个区域内做注意力，再对各区域的汇总向量做注意力：
#
# $$\alpha_{i \mid R} = \frac{\exp(e_i)}{\sum_{k \in R} \exp(e_k)}, \quad r_R = \sum_{i \in R} \alpha_{i \mid R}\, a_i,
#   \qquad \beta_R = \operatorname{softmax}_R(e'_R), \quad z_t = \sum_R \beta_R\, r_R,$$
#
# 于是一个单元的权重是 $\beta_R\, \alpha_{i \mid R}$。选项：`window hierarchical`，`region_size` $r$。

# %%
show("hierarchical", train("hierarchical", STEPS, LANGUAGE, window="hierarchical"))

# %% [markdown]
# ## 注意力之上的注意力（attention-over-attention，Cui 等 2017）
#
# 不要和 Huang 等的 *Attention on Attention*（`aoa`，见笔记本 4）混淆，后者是给上下文向量加门控。Cui 的机制把**已经读过的每个词**和每个位置做比较：匹配矩阵 $M_{ij} = \operatorname{score}(a_i, h_j)$（$L \times t$：行是位置，列是解码器到目前为止的状态 $h_0 \dots h_{t-1}$）对每个状态在位置上做 softmax（按列，$\alpha$），对每个位置在状态上做 softmax（按行，$\beta$）；把状态的权重在位置上取平均得到 $\bar\beta$，再用它加权各状态的注意力图，得到这一步的注意力 $\alpha_t$（Cui 的 $s$）：
#
# $$\alpha_{\cdot j} = \operatorname{softmax}(M_{\cdot j}), \quad \beta_{i \cdot} = \operatorname{softmax}(M_{i \cdot}),
#   \quad \bar\beta = \frac{1}{L}\sum_i \beta_{i \cdot}, \quad \alpha_t = \alpha\, \bar\beta^\top.$$
#
# 选项：`over_attention true`（使用论文的注意力位置 `bahdanau`）。

# %%
show("over_attention", train("over_attention", STEPS, LANGUAGE, over_attention=True))

# %% [markdown]
# ## 多步注意力：卷积解码器（ConvS2S）
#
# Gehring 等（2017）用门控卷积（GLU）代替循环，并且**每一层** $l$ 都做注意力，使用自己的查询 $d_i^l = W_d^l h_i^l + b_d^l + g_i$（$g_i$ 是前一个词的词向量）：
#
# $$\alpha_{ij}^l = \frac{\exp(d_i^l \cdot z_j)}{\sum_k \exp(d_i^l \cdot z_k)}, \qquad
#   c_i^l = \sum_j \alpha_{ij}^l\, (z_j + e_j),$$
#
# 所以后面一层的注意力已经知道前面各层读到了什么。选项：`--model.decoder.kind conv`（`configs/shapes_conv.yaml`）。

# %%
why = missing(kind="conv")
if why:
    print("skipped conv:", why)
else:
    show("conv", train("conv", STEPS, LANGUAGE, config="shapes_conv.yaml", small=False))

# %% [markdown]
# ## 用注意力池化得到初始状态
#
# 论文用注释向量的平均值初始化 LSTM：$h_0 = \tanh(W_h \frac{1}{L}\sum_i a_i)$。文本分类模型则用注意力来池化（Yang 等 2016）：一个可学习的查询向量 $u_w$ 给每个向量打分，
#
# $$u_i = \tanh(W a_i + b), \qquad \alpha_i = \frac{\exp(u_i^\top u_w)}{\sum_k \exp(u_k^\top u_w)},
#   \qquad h_0 = \tanh\Big(W_h \sum_i \alpha_i a_i\Big).$$
#
# 选项：`init attention_pool`。

# %%
show("attention_pool", train("attention_pool", STEPS, LANGUAGE, init="attention_pool"))

# %% [markdown]
# ## 并排比较训练好的模型
#
# 每个模型在同一张图像上的 GIF，每个词一帧：

# %%
for name, (captioner, _) in trained.items():
    [out] = captioner(images[1:2], num_beams=3, return_attention=True)
    print(name, "->", out["generated_text"])
    display(gif(captioner, images[1], out))
