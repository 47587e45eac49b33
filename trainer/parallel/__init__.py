"""How the ranks split one model: data, tensor and pipeline parallelism and
sharded optimizer state, built from PyTorch's own blocks (DeviceMesh,
DTensor's ``parallelize_module``, ``torch.distributed.pipelining``,
``fully_shard``).

:mod:`layout` says who does what (pure); :mod:`mesh` makes the process
groups; :mod:`engine` holds this rank's share of the model and optimizer and
runs one step's forward, backward and update. Each way of splitting lives in
a module of its own (``tensor``, ``pipeline``, ``zero``, ``fsdp``), called by
the engine only.
"""
