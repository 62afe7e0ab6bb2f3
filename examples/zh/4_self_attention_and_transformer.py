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
# # 4. 自注意力与 Transformer
#
# 笔记本 1-3 中的注意力让解码器的状态去看图像。**自注意力**让一个序列看它自己：每个词看它之前的词，每个图像单元看其他所有单元。加上多个头、位置编码和前馈层并堆叠起来，就是 Transformer（Vaswani 等 2017），它完全取代了 LSTM。本笔记本训练一个多头注意力的 LSTM、一个先用自注意力精炼网格的 LSTM，以及一个 Transformer 解码器，并画出它们的注意力矩阵。

# %% tags=["parameters"]
LANGUAGE = "zh"  # 描述的语言："zh"（中文），或 "en"（英文笔记本）
STEPS = 300  # 每个模型的训练步数

# %%
import sys

sys.path[:0] = [".", ".."]  # notebook_tools.py 在 examples/ 里（本文件夹或上一级）
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
# ## 缩放点积注意力
#
# 查询 $Q$（$n \times d_k$）、键 $K$（$m \times d_k$）和值 $V$（$m \times d_v$）：每个查询与每个键比较，再用得到的权重读取值（Vaswani 等，式 1）：
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\Big(\frac{Q K^\top}{\sqrt{d_k}}\Big) V.$$
#
# LSTM 的 `score scaled_dot` 就是只有一个查询（当前状态）的情形。**多头**注意力在不同的可学习投影上并行做 $h$ 次，再把结果拼接起来：
#
# $$\operatorname{head}_j = \operatorname{Attention}(Q W_j^Q, K W_j^K, V W_j^V), \qquad
#   \operatorname{MultiHead}(Q, K, V) = [\operatorname{head}_1; \dots; \operatorname{head}_h]\, W^O.$$
#
# 在 LSTM 解码器中：`--model.decoder.heads 4`（每个头在网格上有自己的注意力图；图片显示它们的平均，或用 `heads="each"` 分别显示每个头）。

# %%
multihead = Captioner.from_checkpoint(train("multihead", STEPS, LANGUAGE, heads=4))
[out] = multihead(images[:1], num_beams=3, return_attention=True)
print(out["generated_text"], "  heads' maps:", np.asarray(out["head_attention"]).shape)
gif(multihead, images[0], out, heads="each")

# %% [markdown]
# ## 网格上的自注意力：精炼器（refiner）
#
# 解码之前，`refiner_layers` 层 Transformer 编码器让每个单元注意所有单元（$Q = K = V = $ 注释向量，再加上二维正弦位置编码，因为注意力本身不知道单元在哪里）：
#
# $$a' = a + \operatorname{MultiHead}(\operatorname{LN}(a), \operatorname{LN}(a), \operatorname{LN}(a)),
#   \qquad a'' = a' + \operatorname{FFN}(\operatorname{LN}(a')).$$
#
# 一个形状上的单元可以汇集这个形状的其余部分，或邻居的颜色。选项：`--model.decoder.refiner_layers 1`。下图：第一层的单元-单元权重，每个单元一行（$L$ 个单元按阅读顺序），对各个头取平均。

# %%
refined = Captioner.from_checkpoint(train("refiner", STEPS, LANGUAGE, refiner_layers=1))
[out] = refined(images[:1], num_beams=3, return_attention=True)
print(out["generated_text"], scores(refined, data))
cells = grid_self_attention(refined, images[0])
print("grid self-attention:", cells.shape, "(heads, cells, cells)")
rows = [str(i) if i % 8 == 0 else "" for i in range(cells.shape[1])]  # the first cell of each row of the grid
matrix(cells.mean(0), rows, cell=6)

# %% [markdown]
# ## Transformer 解码器
#
# `decoder.kind: transformer` 用 $N$ 层取代 LSTM，每一层包括：
#
# 1. 对已写出的词做**带掩码的自注意力**：第 $t$ 个词只能注意第 $1..t$ 个词（后面词的分数在 softmax 之前设为 $-\infty$），所以训练时所有位置可以同时计算；
# 2. 对网格做**交叉注意力**：词是查询，注释向量（投影到模型宽度，加上二维位置编码）是键和值；GIF 画的就是这些注意力图；
# 3. 逐位置的前馈网络 $\operatorname{FFN}(x) = W_2 \max(0, W_1 x + b_1) + b_2$，
#
# 每个子层都在残差连接之内，层归一化在前（pre-LN）。词使用正弦位置编码：$PE_{(p, 2i)} = \sin(p / 10000^{2i/d})$，$PE_{(p, 2i+1)} = \cos(p / 10000^{2i/d})$。`configs/shapes_transformer.yaml`：2 层，每层 4 个头，宽度 128。

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
# GIF 显示的是交叉注意力（各层的平均：`attention_layer: mean`）。词的**自注意力**在每一层、每个头上都是一个下三角矩阵：第 $t$ 行是第 $t$ 个词读取它之前各词的权重（第一列是起始符）。

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
# ## Attention on Attention（Huang 等 2019）
#
# `--model.decoder.aoa true`（LSTM 或 Transformer 都可以）用提出查询的 $q$ 给注意力得到的向量 $\hat v$ 加门控，查询不需要的上下文可以被关掉：
#
# $$i = W_i [\hat v; q] + b_i, \qquad g = \sigma(W_g [\hat v; q] + b_g), \qquad \operatorname{AoA}(\hat v, q) = g \odot i.$$
#
# 这是 Huang 的 *Attention on Attention*，不是 Cui 的*注意力之上的注意力*（attention-over-attention，笔记本 3 的 `over_attention`），后者对已写出各词的注意力图加权。

# %%
grid(transformer, images[1], results[1])
