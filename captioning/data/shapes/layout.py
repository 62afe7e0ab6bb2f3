"""Where the shapes data's objects lie, for the captions of every language (data/shapes/__init__.py,
data/shapes/chinese.py): an object's centre, its cell of a 3 x 3 grid, and the order a caption names
two objects in."""

from __future__ import annotations


def centre(obj: dict) -> tuple[float, float]:
    """The centre (x, y) of an object's bounding box."""
    x0, y0, x1, y1 = obj["bbox"]
    return (x0 + x1) / 2, (y0 + y1) / 2


def grid_cell(obj: dict, size: int) -> tuple[int, int]:
    """(row, column), each 0, 1 or 2, of the 3 x 3 grid cell of a ``size`` x ``size`` image that holds
    the object's centre."""
    cx, cy = centre(obj)
    return min(int(3 * cy / size), 2), min(int(3 * cx / size), 2)


def pair_order(ltr: list[dict]) -> tuple[dict, dict, bool]:
    """(first, second, vertical) of two objects given left to right: a pair that lies mostly one above
    the other (vertical) is named top to bottom, else left to right."""
    (ax, ay), (bx, by) = (centre(o) for o in ltr)
    first, second = ltr
    vertical = abs(ay - by) > abs(ax - bx)
    if vertical and ay > by:
        first, second = second, first
    return first, second, vertical
