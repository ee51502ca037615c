"""ParallelConfig: the CLI's dotted flags reach it, and mistakes are refused in one line."""

import pytest

from gptlab.parallel import ParallelConfig
from gptlab.runtime import GptlabError
from gptlab.runtime.config import apply_overrides
from gptlab.train import TrainConfig


def test_parallel_flags_set_the_train_config():
    config = apply_overrides(TrainConfig(), ["--parallel.data-parallel", "bucketed", "--parallel.bucket-mb=4",
                                             "--parallel.shard-optimizer", "zero1"])
    assert config.parallel == ParallelConfig(data_parallel="bucketed", bucket_mb=4.0, shard_optimizer="zero1")
    assert TrainConfig().parallel == ParallelConfig(data_parallel="torch", shard_optimizer="none", fsdp=False)


@pytest.mark.parametrize(("flags", "message"), [
    (["--parallel.data-parallel", "ring"], "unknown data_parallel 'ring'; use one of torch, allreduce, overlap, bucketed"),
    (["--parallel.fsdp", "true", "--parallel.data-parallel", "overlap"], "fsdp shards the model itself"),
    (["--parallel.fsdp", "true", "--parallel.shard-optimizer", "zero1"], "fsdp already shards the optimizer state"),
    (["--parallel.bucket-mb", "0"], "bucket_mb must be above 0, got 0.0"),
    (["--parallel.shard-optimizer", "zero3"], "unknown shard_optimizer 'zero3'"),
])
def test_parallel_config_mistakes_are_one_line_errors(flags, message):
    with pytest.raises(GptlabError) as error:
        apply_overrides(TrainConfig(), flags)
    assert message in str(error.value) and "\n" not in str(error.value)
