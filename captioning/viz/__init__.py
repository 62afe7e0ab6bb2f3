"""Pictures: the attention grid over the original image, overlays, grids, GIFs, training curves."""
