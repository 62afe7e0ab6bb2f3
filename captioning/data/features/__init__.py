"""Feature caches: a frozen encoder's grids extracted once and read instead of images.

``writer.py`` runs the encoder over a dataset's images into a cache (``captioning extract-features``);
``reader.py`` reads it (:class:`~captioning.data.features.reader.FeatureCache`) and describes the
folder's layout.
"""
