"""The training sampler: shuffled or bucketed by caption length, split over DDP ranks, resumable."""

import numpy as np
import pytest
import torch

from captioning.data.datamodule import CaptionDataModule
from captioning.data.sampling import EpochShuffleSampler
from captioning.errors import ConfigError


def lengths_of(n, seed=0):
    return torch.randint(5, 25, (n,), generator=torch.Generator().manual_seed(seed))


def spread(batches, lengths):
    """Mean (max - min) caption length within a batch."""
    return float(np.mean([lengths[b].max().item() - lengths[b].min().item() for b in batches]))


def test_bucketed_epoch_covers_every_item_once_with_similar_lengths():
    n, bs = 1003, 16
    lengths = lengths_of(n)
    bucketed = EpochShuffleSampler(n, seed=1, batch_size=bs, lengths=lengths)
    shuffled = EpochShuffleSampler(n, seed=1, batch_size=bs)
    batches = bucketed.batches()
    assert sorted(i for b in batches for i in b) == list(range(n))
    assert all(len(b) == bs for b in batches[:-1]) and len(batches[-1]) == n % bs  # the partial batch is last
    assert spread(batches, lengths) <= 1.0 < spread(shuffled.batches(), lengths)
    # batches are still drawn at random: not in length order, and a new order each epoch
    firsts = [lengths[b[0]].item() for b in batches[:-1]]
    assert firsts != sorted(firsts)
    bucketed.set_epoch(1)
    assert bucketed.batches() != batches


@pytest.mark.parametrize("lengths", [None, lengths_of(101)])
def test_ranks_split_the_epoch_into_equal_disjoint_shares(lengths):
    n, bs = 101, 8
    shares = [
        EpochShuffleSampler(n, seed=3, batch_size=bs, lengths=lengths, num_replicas=2, rank=r).batches() for r in (0, 1)
    ]
    assert len(shares[0]) == len(shares[1])  # every rank steps the same number of times
    assert all(len(b) == bs for share in shares for b in share)
    seen = [i for share in shares for b in share for i in b]
    assert set(seen) == set(range(n)) and len(seen) - n < 2 * bs  # everything, padded by less than a batch per rank
    single = EpochShuffleSampler(n, seed=3, batch_size=bs, lengths=lengths).batches()
    assert sorted(i for b in single for i in b) == list(range(n))


def test_a_resumed_sampler_yields_the_rest_of_the_epoch():
    n, bs = 200, 16
    sampler = EpochShuffleSampler(n, seed=5, batch_size=bs, lengths=lengths_of(n), num_replicas=2, rank=1)
    sampler.set_epoch(4)
    full = list(sampler)
    resumed = EpochShuffleSampler(n, seed=5, batch_size=bs, lengths=lengths_of(n), num_replicas=2, rank=1)
    resumed.set_epoch(4)
    resumed.skip = 3 * bs
    assert len(sampler) == len(full)
    assert len(resumed) == len(full)  # the epoch's length: Lightning counts the resumed batches from its own progress
    assert list(resumed) == full[3 * bs :]
    assert list(resumed) == full  # the skip applies once


def test_datamodule_buckets_caption_pairs(tiny_shapes):
    def padding_share(bucket):
        dm = CaptionDataModule(str(tiny_shapes), batch_size=8, image_size=64, min_word_freq=1, bucket_by_length=bucket)
        dm.setup("fit")
        real = padded = 0
        for batch in dm.train_dataloader():
            real += int(batch["lengths"].sum())
            padded += batch["captions"].numel()
        return 1 - real / padded

    assert padding_share(True) < 0.5 * padding_share(False)
    with pytest.raises(ConfigError, match="bucket_by_length"):
        CaptionDataModule(str(tiny_shapes), group_captions=True, bucket_by_length=True)
