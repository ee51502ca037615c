"""Parallel training: data parallel by hand (three variants), optimizer-state sharding (ZeRO-1), FSDP2 wrapping.

Uses only the runtime and torch; the Trainer (gptlab.train) picks a variant through `ParallelConfig`.
"""

from gptlab.parallel.data_parallel import DataParallel
from gptlab.parallel.wrap import ParallelConfig, parallelize
from gptlab.parallel.zero import ShardedOptimizer

__all__ = ["DataParallel", "ParallelConfig", "ShardedOptimizer", "parallelize"]
