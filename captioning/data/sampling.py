"""A training loader that can resume in the middle of an epoch.

Lightning saves the state of a loader that has ``state_dict`` / ``load_state_dict`` in every
checkpoint, and hands it back when a run resumes. :class:`ResumableLoader` keeps the epoch and the
number of batches it has handed out; the order of an epoch is a permutation drawn from
``seed + epoch``, so a resumed run sees exactly the batches the interrupted run had still to see.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Sampler


class EpochShuffleSampler(Sampler[int]):
    """A fresh permutation each epoch, drawn from ``seed + epoch``; can start ``skip`` items in."""

    def __init__(self, size: int, seed: int = 0):
        self.size, self.seed, self.epoch, self.skip = size, seed, 0, 0

    def set_epoch(self, epoch: int) -> None:  # called by Lightning at the start of each epoch
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size - self.skip

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=g).tolist()
        skip, self.skip = self.skip, 0  # a resumed epoch skips once
        return iter(order[skip:])


class ResumableLoader(DataLoader):
    """A shuffling DataLoader whose position within an epoch is saved in checkpoints."""

    def __init__(self, dataset, batch_size: int, seed: int = 0, **kwargs):
        super().__init__(dataset, batch_size=batch_size, sampler=EpochShuffleSampler(len(dataset), seed), **kwargs)
        self._served = 0  # batches handed out in the current epoch

    def __iter__(self):
        self._served = self.sampler.skip // self.batch_size
        for batch in super().__iter__():
            self._served += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "batches": self._served}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.set_epoch(int(state["epoch"]))
        self.sampler.skip = int(state["batches"]) * self.batch_size
