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
# # 1. 论文中的软注意力与硬注意力
#
# *Show, Attend and Tell*（Xu 等，ICML 2015）逐词生成图像描述，并且在写每个词之前先决定**看图中的哪里**。本笔记本在 CPU 上用几分钟、在合成的形状数据上训练论文中的两种模型，然后把它们拆开来看：注释向量、打分、注意力权重 alpha、上下文向量、门控 beta，以及硬注意力采样到的位置。
#
# 这里的一切都在笔记本自己生成的数据上运行。请在仓库的 `examples/zh/` 目录下运行（先 `pip install -e ".[dev]"`，或运行一次会安装全部依赖的 `make test`）。本笔记本训练的是中文描述（形状数据的中文版，jieba 分词）。

# %% tags=["parameters"]
LANGUAGE = "zh"  # 描述的语言："zh"（中文），或 "en"（英文笔记本）
STEPS = 600  # 每个模型的训练步数；步数越多，描述和注意力图越好

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py 在 examples/ 里（本文件夹或上一级）
import numpy as np
from IPython.display import Image, display

from captioning.api import Captioner
from notebook_tools import gif, grid, make_data, matrix, scores, search_views, test_images, train, words

data = make_data(LANGUAGE)
images = test_images(data, 4)
display(Image(filename=images[0], width=160))

# %% [markdown]
# ## 编码器：一张图像变成 L 个注释向量
#
# CNN 把图像变成 $g_h \times g_w = L$ 个网格单元，每个单元是一个向量 $a_i \in \mathbb{R}^D$（论文中用 VGG 的 conv5，$14 \times 14 \times 512$；这里用从零训练的小 CNN，$8 \times 8$ 个单元，$D = 128$）：
#
# $$a = \{a_1, \dots, a_L\}, \quad a_i \in \mathbb{R}^D.$$
#
# ## 解码器：每写一个词之前先做一次注意力的 LSTM
#
# 第 $t$ 步，LSTM 用上一步的隐状态 $h_{t-1}$ 通过一个小网络 $f_{\text{att}}$ 给每个位置打分（论文式 4，即 Bahdanau 的**加性**打分函数），再用 softmax 把分数变成和为 1 的权重（式 5）：
#
# $$e_{ti} = f_{\text{att}}(a_i, h_{t-1}) = w^\top \tanh(W_a a_i + W_h h_{t-1}), \qquad
#   \alpha_{ti} = \frac{\exp(e_{ti})}{\sum_{k=1}^{L} \exp(e_{tk})}.$$
#
# **软注意力**读取注释向量的期望，即加权平均（式 13），再乘以门控 $\beta_t$，让模型能表达"这个词不太需要看图"（4.2.1 节）：
#
# $$\hat z_t = \beta_t \sum_{i=1}^{L} \alpha_{ti}\, a_i, \qquad \beta_t = \sigma(f_\beta(h_{t-1})).$$
#
# LSTM 读入 $[E y_{t-1};\, h_{t-1};\, \hat z_t]$，下一个词由**深度输出层** $p(y_t) \propto \exp(L_o(E y_{t-1} + L_h h_t + L_z \hat z_t))$（式 7）给出。整个过程可微：模型用反向传播最小化 $-\log p(y)$，再加上**双随机正则项** $\lambda \sum_i (1 - \sum_t \alpha_{ti})^2$，它要求每个位置在整句描述中大约被看一次（式 14）。代码就是这些公式：`captioning/models/decoder.py`。
#
# `captioning fit --config configs/shapes_soft_zh.yaml` 训练它；下面的 `train()` 用更小的模型、固定的步数运行同一条命令（关键字参数就是 `--model.decoder.*` 选项）。

# %%
soft_checkpoint = train("soft", STEPS, LANGUAGE)
soft = Captioner.from_checkpoint(soft_checkpoint)
results = soft(images, num_beams=3, return_attention=True)
for path, out in zip(images, results):
    print(path.rsplit("/", 1)[-1], "->", out["generated_text"])

# %% [markdown]
# 每个词都带着它的注意力图 $\alpha_t$，每个网格单元一个权重：`out["attention"]` 的形状是 $(T, g_h, g_w)$，每张图的和为 1。GIF 动图每帧显示一个词的注意力图：

# %%
first = results[0]
alpha = np.asarray(first["attention"])
print("maps:", alpha.shape, " sums:", alpha.reshape(len(alpha), -1).sum(1).round(4))
gif(soft, images[0], first)

# %% [markdown]
# 把同样的注意力图画成机器翻译论文里的**对齐矩阵**：每个词一行，每个位置一列（$L$ 个单元按阅读顺序排列）。尖锐的一行说明这个词只看了一个地方；平坦的一行说明它读了整张图。

# %%
T = len(words(first))
matrix(alpha.reshape(len(alpha), -1)[:T], words(first))

# %% [markdown]
# 每个词的注意力图有多集中？熵 $-\sum_i \alpha_{ti} \log \alpha_{ti}$ 对均匀分布是 $\log L$，只看一个单元时为 0。表示物体的词（形状、颜色）应该看向它的物体；"有""的"这类词不必看特定的地方。

# %%
L = alpha[0].size
for word, m in zip(words(first), alpha.reshape(len(alpha), -1)):
    entropy = float(-(m * np.log(m + 1e-12)).sum())
    row, col = np.unravel_index(m.argmax(), alpha.shape[1:])
    print(f"{word:>10}  entropy {entropy:4.2f} of {np.log(L):.2f}   peak at cell (row {row}, column {col})")

# %% [markdown]
# ### 门控 $\beta_t$
#
# 搜索过程在 alpha 之外还保留每一步的其他信息：门控就是 `model.generate` 结果中的 `views["gate"]`（在记录它的代码版本中）。

# %%
views = search_views(soft, images[0])  # greedy search: its words can differ from the beams' above
if "gate" in views:
    for t, b in enumerate(views["gate"].reshape(len(views["gate"]), -1)[: len(words(first)), 0]):
        print(f"step {t:2d}  beta {b:.2f}")
else:
    print("this version of the package does not keep the gate beta_t in its search")

# %% [markdown]
# ### 整句描述看了哪里？
#
# 每个位置上的 $\sum_t \alpha_{ti}$：双随机正则项会把它推向处处为 1（形状数据的训练配置关掉了这一项，`doubly_stochastic: 0.0`，于是总量集中在物体上）。

# %%
total = alpha[:T].sum(0)
print(np.array2string(total, precision=1, suppress_small=True))

# %% [markdown]
# ## 硬注意力：只采样一个位置
#
# 硬注意力只读**一个**注释向量，按 alpha 采样（式 8-9）：
#
# $$s_t \sim \text{Multinoulli}_L(\{\alpha_{ti}\}), \qquad \hat z_t = a_{s_t}.$$
#
# 采样不可微，所以论文最大化 $\log p(y \mid a)$ 的一个下界 $L_s = \sum_s p(s \mid a) \log p(y \mid s, a)$，它的梯度用采样得到的位置来估计（REINFORCE，式 10-12），并带有滑动平均基线 $b$ 和熵奖励：
#
# $$\frac{\partial L_s}{\partial W} \approx \frac{1}{N}\sum_{n=1}^{N}\Big[
#   \frac{\partial \log p(y \mid \tilde s^n, a)}{\partial W}
#   + \lambda_r \big(\log p(y \mid \tilde s^n, a) - b\big) \frac{\partial \log p(\tilde s^n \mid a)}{\partial W}
#   + \lambda_e \frac{\partial H[\tilde s^n]}{\partial W} \Big].$$
#
# 每条描述以 0.5 的概率改用期望上下文来训练（论文的半采样，semi-sampling）。`configs/shapes_hard.yaml` 就是这个目标函数（`HardAttentionReinforce`）。

# %%
hard_checkpoint = train("hard", STEPS, LANGUAGE, config="shapes_hard.yaml")
hard = Captioner.from_checkpoint(hard_checkpoint)
[hard_out] = hard(images[:1], num_beams=3, return_attention=True)
print(hard_out["generated_text"])
print("chosen cells:", hard_out["locations"][: len(words(hard_out))])
gif(hard, images[0], hard_out)

# %% [markdown]
# GIF 在每个词的淡色软注意力图上框出模型实际读取的单元。硬注意力模型解码时有三种方式（`attention_mode`）：`expected`（用 alpha 的期望上下文，默认）、`argmax`（概率最大的单元）和 `sample`（按 alpha 抽一个单元，每次可能不同）：

# %%
for mode in ("expected", "argmax", "sample", "sample"):
    [out] = hard(images[:1], num_beams=1, attention_mode=mode, return_attention=True)
    print(f"{mode:>8}: {out['generated_text']}   cells {out['locations'][:4]}")

# %% [markdown]
# ## 软注意力与硬注意力在测试集上的比较
#
# 物体 F1：描述是否说对了（大小、颜色、形状）三元组？指向游戏（pointing game）：表示形状的词，其注意力图的最大值落在该物体框内的比例（均匀注意力约为 0.07）。训练几百步之后，两者都离 README 中充分训练的数字还很远（`make demo` 用完整尺寸的模型训练 1,200 步）：调大 `STEPS` 看它们上升。

# %%
for name, captioner in (("soft", soft), ("hard", hard)):
    print(name, scores(captioner, data))

# %% [markdown]
# ## 接下来
#
# - `grid(soft, images[1], results[1])` 为每个词画一个面板，而不是 GIF。
# - 命令行 `captioning attend IMAGE --checkpoint CKPT --out maps.gif` 画出同样的图，`captioning serve --checkpoint CKPT --lang zh` 在中文网页上查看。
# - 笔记本 2 更换打分函数 $f_{\text{att}}$ 和 softmax；笔记本 3 限制模型可以看的位置；笔记本 4 用自注意力取代 LSTM。

# %%
grid(soft, images[1], results[1])
