"""``elasticps bench peers``: the runtime beside DDP, a plain Ray PS, Ray Train and torchrun, in one run."""
