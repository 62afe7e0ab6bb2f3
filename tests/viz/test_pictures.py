"""Attention overlays, GIFs and grids."""

import numpy as np
import pytest
from PIL import Image, ImageSequence

from captioning.viz import pictures as V


def _one_hot(gh, gw, row, col):
    grid = np.zeros((gh, gw))
    grid[row, col] = 1.0
    return grid


def test_upsample_map_puts_a_cell_on_its_region_of_a_non_square_image():
    gh, gw, W, H = 3, 4, 200, 90  # a cell is 50 wide and 30 high
    up = V.upsample_map(_one_hot(gh, gw, 1, 2), (W, H))
    assert up.shape == (H, W) and (up >= 0).all()
    y, x = np.unravel_index(up.argmax(), up.shape)
    assert 30 <= y < 60 and 100 <= x < 150
    cells = up.reshape(gh, H // gh, gw, W // gw).sum(axis=(1, 3))  # mass per cell
    assert cells.argmax() == 1 * gw + 2 and cells[1, 2] > 0.5 * cells.sum()  # bicubic spills the rest nearby
    assert np.allclose(V.upsample_map(np.full((2, 5), 0.1), (7, 3)), 0.1)  # constant stays constant
    with pytest.raises(ValueError, match="2-D"):
        V.upsample_map(np.zeros(4), (8, 8))


def test_overlay_styles_and_hard_cell():
    image = Image.new("RGB", (120, 80), (100, 150, 200))
    grid = _one_hot(2, 3, 0, 0)
    for style in V.STYLES:
        out = V.overlay(image, grid, style=style)
        assert out.mode == "RGB" and out.size == image.size
        a = np.asarray(out, dtype=float)
        assert a[20, 20].sum() > a[60, 100].sum()  # the attended corner is brighter
    assert V.overlay(image, grid, alpha=0.0).tobytes() == image.tobytes()
    hard = np.asarray(V.overlay(image, grid, hard_cell=(1, 2)))
    assert (hard[41, 81] == 255).all()  # the white outline inside cell (1, 2) = x 80..120, y 40..80
    assert V.overlay(image, grid, hard_cell=5).tobytes() == V.overlay(image, grid, hard_cell=(1, 2)).tobytes()
    with pytest.raises(ValueError, match="style"):
        V.overlay(image, grid, style="sketch")
    with pytest.raises(ValueError, match="outside"):
        V.overlay(image, grid, hard_cell=(2, 0))


def test_colormaps():
    assert V.colorize(np.array([[0.0, 1.0]]), "inferno").tolist() == [[[0, 0, 4], [252, 255, 164]]]
    assert V.colorize(np.array([0.5]), "jet").tolist() == [[128, 255, 128]]
    with pytest.raises(ValueError, match="colour map"):
        V.colorize(np.zeros(2), "no-such-map")


def test_gif_has_a_frame_per_word_plus_the_caption(tmp_path):
    image = Image.new("RGB", (64, 48), (30, 30, 30))
    words = ["a", "red", "circle"]
    maps = np.stack([_one_hot(4, 4, t, t) for t in range(3)])  # (T, gh, gw)
    path = V.save_gif(image, words, maps, tmp_path / "sub" / "att.gif", duration_ms=250, hard_cells=[0, 5, (2, 2)])
    assert path.exists() and not list(path.parent.glob(".*tmp"))
    with Image.open(path) as gif:
        frames = list(ImageSequence.Iterator(gif))
        assert len(frames) == len(words) + 1 and gif.info["loop"] == 0
        assert all(f.info["duration"] == 250 for f in frames)
        assert min(gif.size) >= 256 and gif.size[1] > 256 * 48 / 64  # scaled up, a text band below

    frames = V.render_frames(image, words, maps)
    assert len(frames) == 4 and len({f.size for f in frames}) == 1
    with pytest.raises(ValueError, match="one per word"):
        V.render_frames(image, words, maps[:2])


def _runs(mask_1d):
    """Number of runs of True."""
    m = np.concatenate([[False], mask_1d, [False]])
    return int((m[1:] & ~m[:-1]).sum())


@pytest.mark.parametrize("n, cols", [(7, 3), (2, 5), (5, 5)])
def test_grid_has_one_panel_per_word(tmp_path, n, cols):
    image = Image.new("RGB", (40, 30), (90, 90, 90))
    words = ["x"] * n  # short titles stay inside the middle of each panel
    maps = np.random.default_rng(0).random((n, 3, 3))
    grid = V.render_grid(image, words, maps, cols=cols, panel_size=80)
    ink = (np.asarray(grid) < 250).any(axis=2)  # (H, W) non-white pixels
    n_cols = _runs(ink.any(axis=0))
    left = np.flatnonzero(ink.any(axis=0))[0] + 1  # a column at a panel's left edge: no title there
    row_runs = ink[:, left]
    n_rows = _runs(row_runs)
    last_row_y = np.flatnonzero(row_runs)[-1] - 5
    assert n_cols == min(n, cols) and (n_rows, n_cols) == V.panel_layout(n, cols)
    assert (n_rows - 1) * n_cols + _runs(ink[last_row_y]) == n

    path = V.save_grid(image, words, maps, tmp_path / "grid.png", cols=cols, panel_size=80)
    with Image.open(path) as png:
        assert png.size == grid.size


@pytest.mark.parametrize(
    "size, words",
    [
        ((640, 480), ["a", "cat"]),
        ((100, 60), ["one"] * 12),
        ((2000, 300), []),
        ((300, 900), ["a", "very", "long", "caption", "that", "wraps"] * 5),
    ],
)
def test_gif_frame_size_is_the_size_render_frames_draws(size, words):
    """The GIF budget of the web server measures frames with gif_frame_size: it must be the drawn size."""
    image = Image.new("RGB", size, (90, 120, 200))
    maps = np.random.default_rng(0).random((len(words), 3, 3))
    frames = V.render_frames(image, words, maps)
    width, height = V.display_size(size)
    assert min(width, height) >= min(256, round(min(size) * 640 / max(size))) and max(width, height) <= 640
    assert frames[0].size == V.gif_frame_size(size, words) == (width, height + V.caption_band(words, width))
    small = V.render_frames(image, words, maps, min_side=50, max_side=120)
    assert small[0].size == V.gif_frame_size(size, words, min_side=50, max_side=120)


def test_gif_bytes_are_the_file_save_frames_writes(tmp_path):
    image = Image.new("RGB", (80, 60), (10, 200, 30))
    frames = V.render_frames(image, ["a", "b"], np.random.default_rng(1).random((2, 2, 2)))
    path = V.save_frames(frames, tmp_path / "a.gif", duration_ms=300)
    assert path.read_bytes() == V.gif_bytes(frames, duration_ms=300)
    with Image.open(path) as gif:
        assert gif.n_frames == 3 and gif.info["duration"] == 300
