"""The project's own error types.

Every error a user can cause (a bad image, annotation file, checkpoint or config) is raised as a
subclass of :class:`CaptioningError` whose message is one line naming the file and the problem.
The CLI prints that line and exits non-zero, without a traceback.
"""


class CaptioningError(Exception):
    """Base class of every user-facing error."""


class ImageError(CaptioningError):
    """An image file that is missing, unreadable or not an image."""


class ImageTooLargeError(ImageError):
    """An image of more pixels than the decoder allows (a decompression bomb)."""


class NotAnImageError(ImageError):
    """A file that is no image of an accepted format (data/images.py: IMAGE_FORMATS)."""


class AnnotationError(CaptioningError):
    """An annotation or captions file that is missing, malformed or lacks a field."""


class CheckpointError(CaptioningError):
    """A checkpoint that is missing, unsafe or incompatible."""


class ConfigError(CaptioningError):
    """A configuration value that cannot be used."""
