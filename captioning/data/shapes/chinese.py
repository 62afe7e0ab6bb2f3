"""The shapes data's captions in Chinese (``captioning make-shapes --language zh``), and their objects.

The same scenes as the English captions (data/shapes/__init__.py), described in Chinese word order rather
than word for word. An object is "<colour>的<size><shape>" ("红色的大圆形", a large red circle),
counted with the classifier 个 ("一个红色的大圆形"). A place comes first as the topic of an
existential 有 ("左上角有一个红色的大圆形", there is ... in the top left); a relation is
"A在B的左边" (A to the left of B); a listing is "从左到右依次是A、B和C". Each scene gets as many
phrasings as the English one, drawn with the same random numbers, so the images are the same.

:func:`locate_objects_zh` finds the (size, colour, shape) mentions, in English words, in text or in
tokens of any tokenizer (the evaluator's object F1 and attention grounding).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from captioning.data.shapes.layout import centre, grid_cell, pair_order

SIZES_ZH = {"small": "小", "medium": "中", "large": "大"}
COLOURS_ZH = {
    "red": "红色",
    "green": "绿色",
    "blue": "蓝色",
    "yellow": "黄色",
    "purple": "紫色",
    "orange": "橙色",
    "cyan": "青色",
    "white": "白色",
}
SHAPES_ZH = {
    "circle": "圆形",
    "square": "正方形",
    "triangle": "三角形",
    "cross": "十字形",
    "diamond": "菱形",
    "ring": "圆环",
}
_NUMBERS_ZH = {2: "两", 3: "三", 4: "四"}
_FROM = {value: key for table in (SIZES_ZH, COLOURS_ZH, SHAPES_ZH) for key, value in table.items()}
# a mention: colour, an optional 的, size, shape ("红色的大圆形")
_MENTION = re.compile(
    f"({'|'.join(COLOURS_ZH.values())})的?({'|'.join(SIZES_ZH.values())})"
    f"({'|'.join(sorted(SHAPES_ZH.values(), key=len, reverse=True))})"
)


def name_zh(obj: dict) -> str:
    """'红色的大圆形' of an object whose words are (size, colour, shape)."""
    size, colour, shape = obj["words"]
    return f"{COLOURS_ZH[colour]}的{SIZES_ZH[size]}{SHAPES_ZH[shape]}"


def position_zh(obj: dict, size: int) -> str:
    """Where an object lies on a 3 x 3 grid: 左上角, 上方, 右上角, 左边, 中间, 右边, 左下角, 下方, 右下角."""
    row, col = grid_cell(obj, size)
    return (("左上角", "上方", "右上角"), ("左边", "中间", "右边"), ("左下角", "下方", "右下角"))[row][col]


def _listing(names: Sequence[str]) -> str:
    """'一个A' | '一个A和一个B' | '一个A、一个B和一个C'."""
    names = [f"一个{n}" for n in names]
    return names[0] if len(names) == 1 else "、".join(names[:-1]) + "和" + names[-1]


def captions_zh(rng: np.random.Generator, objects: list[dict], size: int) -> list[str]:
    """Five reference captions in Chinese: the canonical phrasing first, then four others drawn at
    random (as many choices as data/shapes/__init__.py's English ones, so the same random numbers are drawn)."""
    ltr = sorted(objects, key=lambda o: centre(o))  # left to right, then top down
    names = [name_zh(o) for o in ltr]
    if len(objects) == 1:
        o, pos = names[0], position_zh(objects[0], size)
        canonical = f"一个{o}"
        others = [
            f"{pos}有一个{o}",
            f"图中有一个{o}",
            f"图片的{pos}有一个{o}",
            f"一张有一个{o}的图片",
            f"{pos}只有一个{o}",
        ]
    elif len(objects) == 2:
        first, second, vertical = pair_order(ltr)
        if vertical:  # one above the other: top to bottom, 上面 / 下面
            rel, inv, axis = "上面", "下面", "从上到下"
        else:
            rel, inv, axis = "左边", "右边", "从左到右"
        a, b = name_zh(first), name_zh(second)
        canonical = f"{a}在{b}的{rel}"
        others = [
            f"{b}在{a}的{inv}",
            f"图中{a}在{b}的{rel}",
            f"{axis}是一个{a}和一个{b}",
            f"{position_zh(first, size)}有一个{a}，{position_zh(second, size)}有一个{b}",
            f"有两个图形，{a}在{b}的{rel}",
        ]
    else:
        ttb = sorted(objects, key=lambda o: centre(o)[::-1])
        canonical = f"从左到右依次是{_listing(names)}"
        others = [
            f"从右到左依次是{_listing(names[::-1])}",
            f"从上到下依次是{_listing([name_zh(o) for o in ttb])}",
            f"一个{names[0]}旁边有{_listing(names[1:])}",
            f"有{_NUMBERS_ZH[len(objects)]}个图形，从左到右依次是{_listing(names)}",
        ]
        if len(objects) == 3:  # as in English, the phrasing of places only with three objects
            others.append("，".join(f"{position_zh(o, size)}有一个{name_zh(o)}" for o in ltr))
    picked = rng.choice(len(others), size=4, replace=False)
    return [canonical] + [others[i] for i in sorted(picked)]


def locate_objects_zh(tokens: str | Sequence[str]) -> list[tuple[int, tuple[str, str, str]]]:
    """(index of the token holding the shape's last character, (size, colour, shape) in English) of
    each mention in Chinese text or tokens, in order; with text, the index is the character's."""
    pieces = [tokens] if isinstance(tokens, str) else [str(t) for t in tokens]
    owner = []  # character -> index of its token (or of the character, for text)
    for i, piece in enumerate(pieces):
        owner.extend([i] * len(piece) if not isinstance(tokens, str) else range(len(piece)))
    text = "".join(pieces)
    found = []
    for match in _MENTION.finditer(text):
        colour, size, shape = (_FROM[g] for g in match.groups())
        found.append((owner[match.end() - 1], (size, colour, shape)))
    return found
