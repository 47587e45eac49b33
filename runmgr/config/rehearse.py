"""The ``rehearse`` section: how ``runmgr launch conf=NAME --rehearse`` sizes the
rehearsal of a run (the planner that makes it small: runmgr/rehearsal.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class RehearseConfig:
    """How ``runmgr launch --rehearse`` sizes the rehearsal of this run
    (runmgr/rehearsal.py; ``rehearse.train_iters=300`` and so on). Only
    read with ``--rehearse``: set without it, it is refused."""

    train_iters: int = 200
    """Optimizer steps of the rehearsal; the warmup keeps the real run's fraction of its steps."""
    num_layers: int = 2
    """Transformer blocks (raised to a multiple of the pipeline degree)."""
    hidden_size: int = 64
    """Width of the residual stream; the MLP keeps the real run's ffn/hidden ratio."""
    num_attention_heads: int = 4
    """Query heads; divisible by the tensor-parallel degree (as the real run's are)."""
    seq_length: int = 64
    """Tokens per sample."""
    vocab_size: int = 256
    """The embedded byte corpus's vocabulary (divisible by the tensor-parallel degree)."""
    micro_batch_size: int = 4
    """Samples per rank per forward/backward."""
    global_batch_size: int = 16
    """Samples per step (a multiple of micro_batch_size x the rehearsal's data-parallel size)."""
    max_tensor_parallel: int = 2
    """The real run's tensor-parallel degree, capped at this."""
    max_pipeline_parallel: int = 2
    """The real run's pipeline degree, capped at this."""
    max_workers: int = 4
    """Ranks this machine holds: the data-parallel degree is what is left of them (at least 1)."""
    save_interval: int = 20
    """Checkpoint every this many steps (rollbacks need checkpoints within a few hundred steps)."""
    chaos: str = "rehearsal"
    """The chaos schedule injected (conf/chaos/<name>.yaml; ``none``: no faults)."""
    watcher: str = "demo"
    """The preset of the watcher's step and time windows (conf/watcher/<name>.yaml); its thresholds stay the run's."""
    policy: str = "demo"
    """The preset of the policy's step windows (conf/policy/<name>.yaml); its ladder and budgets stay the run's."""
    poll_interval_s: float = 2.0
    """The device poll's period during the rehearsal (a few hundred steps pass in minutes)."""
    of: Optional[str] = None
    """Set by ``--rehearse`` on the rehearsal's own config: the run it rehearses (the logbook shows it)."""

    def problems(self) -> list[str]:
        positives = {name: getattr(self, name) for name in (
            "train_iters", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
            "micro_batch_size", "global_batch_size", "max_tensor_parallel", "max_pipeline_parallel",
            "max_workers", "save_interval")}
        out = [f"rehearse.{key} must be a positive integer, got {value}" for key, value in positives.items()
               if value <= 0]
        if self.poll_interval_s <= 0:
            out.append(f"rehearse.poll_interval_s must be > 0, got {self.poll_interval_s}")
        return out
