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
# # 2. 打分函数与归一化函数
#
# 课程讲义里的每一种注意力机制都有相同的两步：先用解码器的状态给每个位置**打分**，再把分数**归一化**成权重。本笔记本为每种打分函数各训练一个模型（同样的数据、同样的步数），看看它们各自注意哪里；然后把 softmax 和 sparsemax 放在一起比较——后者可以让某些位置的权重恰好为零。
#
# 记号与笔记本 1 相同：注释向量 $a_i \in \mathbb{R}^D$（$i = 1..L$），解码器状态 $h \in \mathbb{R}^H$，分数 $e_i$，权重 $\alpha_i$，上下文向量 $z = \sum_i \alpha_i a_i$。

# %% tags=["parameters"]
LANGUAGE = "zh"  # 描述的语言："zh"（中文），或 "en"（英文笔记本）
STEPS = 300  # 每个模型的训练步数

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py 在 examples/ 里（本文件夹或上一级）
import numpy as np

from captioning.api import Captioner
from notebook_tools import grid, make_data, missing, scores, test_images, train

data = make_data(LANGUAGE)
images = test_images(data, 2)

# %% [markdown]
# ## 打分函数
#
# | 机制 | 分数 $e_i$ | 选项 |
# |---|---|---|
# | 加性注意力（Bahdanau 等 2015；论文式 4） | $v^\top \tanh(W_a a_i + W_h h)$ | `--model.decoder.score additive`（默认） |
# | concat（Luong 等 2015） | $v^\top \tanh(W [h; a_i])$ | `score concat` |
# | 点积 dot（Luong） | $h^\top a_i$（要求 $H = D$） | `score dot` |
# | general（Luong） | $h^\top W a_i$ | `score general` |
# | 缩放点积（Vaswani 等 2017） | $(W_q h)^\top (W_k a_i) / \sqrt{d}$ | `score scaled_dot` |
# | 归一化的 Bahdanau（TensorFlow 的 `normalize=True`） | $g \frac{v^\top}{\lVert v \rVert} \tanh(W_a a_i + W_h h + b)$ | `normalize true` |
# | 缩放的 Luong（TensorFlow 的 `scale=True`） | $g\, h^\top W a_i$，$g$ 是可学习的标量 | `score general` + `scale true` |
# | 无注意力：固定的上下文 | 每个词都是 $\alpha_i = 1/L$ | `score uniform` |
#
# 加性与 concat 属于同一类：$W [h; a_i] = W_h h + W_a a_i$，是同时作用于两者的单层网络。dot 和 general 是双线性的：更便宜（每个位置一次乘积），dot 甚至没有参数。缩放点积除以 $\sqrt{d}$，使分数的分布范围不随维度增大。
#
# **均匀打分就是没有注意力的编码器-解码器**：每个词读到的都是同一个平均向量 $\bar a = \frac{1}{L}\sum_i a_i$，整张图必须挤进一个固定长度的上下文向量。这就是注意力机制要消除的瓶颈，也是每种机制都应该超过的基线。
#
# 下面每个模型都是本笔记本的小模型只改一个选项。当前版本的代码包还没有的机制会被跳过，并说明原因。

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
# 同一张测试图像经过每个模型：它的描述，以及每个词一个面板。比较注意力图的集中程度，以及表示形状的词是否落在对应的形状上。

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
# ## 在整个测试集上
#
# 物体 F1（描述说对了哪些物体）和指向游戏（形状词的注意力图最大值落在物体框内的比例；均匀注意力约为 0.07），以及注意力图的平均熵（单位：nat；均匀分布为 $\log L$）。几百步的训练只能粗略地给这些机制排序：数字会随随机种子变化。

# %%
print(f"{'mechanism':>20}  object F1  pointing  entropy")
for name, captioner in captioners.items():
    s = scores(captioner, data)
    maps = np.asarray(results[name]["attention"]).reshape(len(results[name]["attention"]), -1)
    entropy = float(-(maps * np.log(maps + 1e-12)).sum(1).mean())
    pointing = "-" if s["pointing game"] is None else f"{s['pointing game']:.3f}"  # -：描述中没有提到任何形状
    print(f"{name:>20}  {s['object F1']:9.3f}  {pointing:>8}  {entropy:7.2f}")

# %% [markdown]
# ## 归一化函数：softmax 还是 sparsemax
#
# softmax 给每个位置都分一点权重：$\operatorname{softmax}(e)_i = \exp(e_i) / \sum_k \exp(e_k) > 0$。
# **Sparsemax**（Martins 与 Astudillo 2016）是分数在单纯形上的欧氏投影：
#
# $$\operatorname{sparsemax}(e) = \operatorname*{arg\,min}_{p \in \Delta^{L-1}} \lVert p - e \rVert^2
#   = \big[e_i - \tau(e)\big]_+ ,$$
#
# 阈值 $\tau$ 由排序后的分数 $e_{(1)} \ge e_{(2)} \ge \dots$ 得到：$k(e) = \max\{k : 1 + k\, e_{(k)} > \sum_{j \le k} e_{(j)}\}$，$\tau(e) = \big(\sum_{j \le k(e)} e_{(j)} - 1\big) / k(e)$。分数低于 $\tau$ 的位置权重恰好为零：注意力图有了"支撑集"。


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
# 把分数放大会让两者都更尖锐，但只有 sparsemax 会出现精确的零（放大到一定程度时只剩一个位置：不用采样就得到硬注意力的 one-hot 注意力图）：

# %%
for scale in (0.5, 1, 2, 4):
    print(f"x{scale:<3} softmax {softmax(scale * e).round(2)}   sparsemax {sparsemax(scale * e).round(2)}")

# %% [markdown]
# `--model.decoder.normalizer sparsemax` 用它来训练解码器（式 5 中用 sparsemax 代替 softmax）。在有这个机制的版本中，代码包的 sparsemax 必须等于上面的闭式解：

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
# ## 接下来
#
# - 训练更久（`STEPS`）或换一个随机种子（`train(..., seed=1)`），看看哪些差别是稳定的。
# - 命令行 `captioning compare-attention IMAGE --checkpoints A B --labels a b --out DIR` 把几个模型的注意力图并排画出来。
# - 笔记本 3：模型可以看哪里（局部窗口、区域），以及多次注意。
