"""An elastic data cursor: a rescale neither repeats nor skips a sample.

The data is one endless stream: epoch 0's permutation of the indices, then epoch 1's, and so
on (each a fixed function of the seed and the epoch). The position in that stream, the
number of samples the job has consumed, is part of the checkpoint. Each step takes the next
``batch_size x world_size`` positions and gives rank r its ``r``-th slice, so after a
restart with another world size the remaining stream is simply re-sharded.

The position is derived from the step counter rather than counted as batches are drawn,
so a DataLoader that prefetches ahead does not move the cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class ElasticBatchSampler:
    """Yields this rank's list of indices for each step, from the state's position on.

    Use as ``DataLoader(dataset, batch_sampler=state.batch_sampler(dataset, 32))``.
    ``batch_size`` is per rank. Endless: it cycles through epochs.
    """

    def __init__(
        self,
        state: Any,  # the State whose position this is (data sits below state: no import)
        dataset_or_len: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        batches_per_step: int = 1,
    ) -> None:
        n = dataset_or_len if isinstance(dataset_or_len, int) else len(dataset_or_len)
        if n <= 0:
            raise ValueError("batch_sampler() needs a non-empty dataset")
        if batch_size <= 0 or batches_per_step <= 0:
            raise ValueError("batch_sampler() needs batch_size >= 1 and batches_per_step >= 1")
        self.state = state
        self.num_samples = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.batches_per_step = batches_per_step
        self.rank = state.info.rank
        self.world_size = state.info.world_size
        self.global_batch_size = batch_size * self.world_size
        self._perm_epoch = -1
        self._perm: list[int] = []
        self.last_start: int | None = None  # stream position of the batch last yielded here

    @property
    def epoch(self) -> int:
        epoch: int = self.state.samples_seen // self.num_samples
        return epoch

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._perm_epoch:
            if self.shuffle:
                import torch

                g = torch.Generator()
                g.manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                self._perm = list(range(self.num_samples))
            self._perm_epoch = epoch
        return self._perm

    def indices(self, start: int, count: int) -> list[int]:
        """The dataset indices at stream positions ``start .. start + count - 1``."""
        out = []
        pos = start
        end = start + count
        while pos < end:
            epoch, offset = divmod(pos, self.num_samples)
            perm = self._permutation(epoch)
            take = min(end - pos, self.num_samples - offset)
            out.extend(perm[offset : offset + take])
            pos += take
        return out

    def __iter__(self) -> Iterator[list[int]]:
        position = self.state._cursor_at(self.state.step)
        while True:
            start = position + self.rank * self.batch_size
            self.last_start = start
            yield self.indices(start, self.batch_size)
            position += self.global_batch_size
