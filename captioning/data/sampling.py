"""A training loader that can resume in the middle of an epoch, on one process or under DDP.

Lightning saves the state of a loader that has ``state_dict`` / ``load_state_dict`` in every
checkpoint, and hands it back when a run resumes. :class:`ResumableLoader` keeps the epoch and the
number of samples it has handed out; the order of an epoch is drawn from ``seed + epoch``, so a
resumed run sees exactly the batches the interrupted run had still to see (a resume that would draw
another order, of another seed, batch size or number of processes, is refused).

The epoch's order is a list of batches. Shuffled: a random permutation cut into batches. Bucketed
by length (``lengths`` given): captions of similar length are batched together, as the authors'
code does, so that a batch wastes few padded steps. A random permutation is cut into chunks of
``bucket_batches`` batches, each chunk is sorted by caption length and cut into batches, and the
full batches of the epoch are shuffled (a last, partial batch stays last). Under DDP each rank
takes every ``num_replicas``-th batch; the epoch is first padded (with its first items) to a whole
number of full batches per rank, as DistributedSampler pads, so that every rank steps the same
number of times.

Both the training and the evaluation loaders are :class:`SharingLoader`: their worker processes
start with the garbage collector's objects frozen, so that a collection in a worker never walks
(and so copies) the objects it shares with its parent.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from captioning.errors import ConfigError


class EpochShuffleSampler(DistributedSampler):
    """Indices of one epoch, batch after batch, from ``seed + epoch``; can start ``skip`` items in.

    A DistributedSampler (so that Lightning leaves it in place under DDP) that yields this rank's
    share. ``batch_size`` must be the loader's: the indices come in whole batches.
    """

    def __init__(
        self,
        size: int,
        seed: int = 0,
        batch_size: int = 1,
        lengths: Sequence[int] | None = None,
        num_replicas: int = 1,
        rank: int = 0,
        bucket_batches: int = 50,
    ):
        super().__init__(range(size), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.size, self.batch_size = size, batch_size
        self.lengths = None if lengths is None else torch.as_tensor(lengths)
        self.bucket_batches = bucket_batches
        self.skip = 0  # items of the current epoch already served (a resumed run's): skipped once

    def batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch (the same on every call)."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=g)
        bs = self.batch_size
        if self.lengths is not None:
            chunk = bs * self.bucket_batches
            pieces = []
            for start in range(0, self.size, chunk):
                part = order[start : start + chunk]
                # sort by length; the permutation's order breaks ties (stable sort)
                pieces.append(part[torch.sort(self.lengths[part], stable=True).indices])
            order = torch.cat(pieces) if pieces else order
        if self.num_replicas > 1:
            # A whole number of whole batches per rank: pad with the epoch's first items.
            total = self._batches_per_rank() * self.num_replicas * bs
            if total > self.size > 0:
                order = torch.cat([order, order.repeat(-(-total // self.size))[: total - self.size]])
        batches = list(order.split(bs))
        if self.lengths is not None:  # shuffle the batches; a last, partial one stays last
            full = [b for b in batches if len(b) == bs]
            batches = [full[i] for i in torch.randperm(len(full), generator=g).tolist()] + batches[len(full) :]
        batches = batches[self.rank :: self.num_replicas]
        return [b.tolist() for b in batches]

    def set_epoch(self, epoch: int) -> None:
        """Another epoch than the current one drops the skip: a position saved at the end of an epoch
        (at its validation) resumes into the whole next epoch."""
        if epoch != self.epoch:
            self.skip = 0
        super().set_epoch(epoch)

    def _batches_per_rank(self) -> int:
        """Under DDP: whole batches per rank after padding."""
        return -(-self.size // (self.batch_size * self.num_replicas))

    def __len__(self) -> int:
        """The whole epoch's share of this rank, without drawing the epoch. A resumed epoch yields
        ``skip`` items fewer, but Lightning counts its batches from the restored progress, so the
        length stays that of the whole epoch (or the loop would end the resumed epoch early)."""
        if self.num_replicas == 1:
            return self.size
        return self._batches_per_rank() * self.batch_size

    def __iter__(self) -> Iterator[int]:
        order = [i for batch in self.batches() for i in batch]
        skip, self.skip = self.skip, 0  # a resumed epoch skips once
        return iter(order[skip:])


class SharingLoader(DataLoader):
    """A DataLoader whose worker processes (forked) leave alone the objects they share with the
    training process.

    The workers are started with every object the garbage collector tracks frozen (``gc.freeze``;
    thawed again at once in the parent). So a full collection in a worker, which writes a field of
    every object it walks, does not copy the parent's pages (what it saves a worker at COCO's size:
    docs/PERFORMANCE.md, "COCO-sized data"). The datasets hold their
    records as arrays (data/datasets.py), so that reading them copies nothing either."""

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        gc.freeze()  # the workers are forked now (persistent ones once): they inherit the frozen state
        try:
            return super()._get_iterator()
        finally:
            gc.unfreeze()


class ResumableLoader(SharingLoader):
    """A shuffling (or length-bucketing) DataLoader whose position within an epoch is saved in checkpoints."""

    def __init__(
        self,
        dataset,
        batch_size: int,
        seed: int = 0,
        lengths: Sequence[int] | None = None,
        num_replicas: int = 1,
        rank: int = 0,
        **kwargs,
    ):
        sampler = EpochShuffleSampler(len(dataset), seed, batch_size, lengths, num_replicas, rank)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self._served = 0  # batches handed out in the current epoch

    def __iter__(self):
        self._served = self.sampler.skip // self.batch_size
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict:
        """The epoch and the position in it, counted in this rank's samples (and in batches, what a
        state without ``samples`` resumes from), and the settings the order is drawn from."""
        sampler = self.sampler
        return {
            "epoch": sampler.epoch,
            "batches": self._served,
            "samples": self._served * self.batch_size,
            "batch_size": self.batch_size,
            "seed": sampler.seed,
            "num_replicas": sampler.num_replicas,
            "bucketed": sampler.lengths is not None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue ``state``'s epoch where it stopped; a :class:`ConfigError` of one line if this
        loader draws another order than the one that saved it (a state that lacks a setting is not
        checked for it)."""
        sampler = self.sampler
        here = {
            "batch_size": self.batch_size,
            "seed": sampler.seed,
            "num_replicas": sampler.num_replicas,
            "bucketed": sampler.lengths is not None,
        }
        for key, value in here.items():
            if key in state and state[key] != value:
                raise ConfigError(
                    f"the training loader's {key} is {state[key]!r} in the checkpoint, {value!r} here: "
                    "the resumed epoch would not continue the saved one"
                )
        sampler.set_epoch(int(state["epoch"]))
        sampler.skip = int(state["samples"]) if "samples" in state else int(state["batches"]) * self.batch_size
