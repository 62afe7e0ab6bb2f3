"""``python -m captioning.fast``: the fingerprints of the plain code the fast path mirrors, as
captioning/fast/__init__.py's MIRRORED should record them once the twin matches that code again."""

from captioning.fast import MIRRORED, fingerprint

for name in MIRRORED:
    print(f'    "{name}": "{fingerprint(name)}",')
