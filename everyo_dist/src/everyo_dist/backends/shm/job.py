"""What ``spawn`` prepares for a job of ``shm`` workers: the control segment they all join."""

from __future__ import annotations

from contextlib import contextmanager

from everyo_dist.backends.shm.group import BLOCK
from everyo_dist.backends.shm.segments import (
    Segment,
    new_job_id,
    remove_job_segments,
    segment_name,
    sweep_stale_segments,
)


@contextmanager
def prepare_shm_job(world_size: int, options: dict):
    """Create the job's control segment; afterwards remove every segment the job left.

    Args:
        world_size: number of workers.
        options: the factory options the caller chose.
    Yields:
        ``options`` plus ``segment``, the control segment's name.
    """
    sweep_stale_segments()
    job = new_job_id()
    name = segment_name(job, "ctl")
    control = Segment(name, world_size * BLOCK, create=True)
    try:
        yield {**options, "segment": name}
    finally:
        control.close()
        remove_job_segments(job)
