"""What a rank's start costs: a fresh process against one forked from a server that imported
the trainer once (runmgr/agents/rank_processes.py), measured side by side in one run.

    .venv/bin/python bench/rank_start.py [--ranks 4] [--steps 2]

Each mode starts ``--ranks`` ranks one after the other (one rank each, the e2e model, a
checkpoint at its last step) and reads the CPU-seconds each rank's process used, as the rank
said it when it ended. The server's own imports are measured apart (the same imports in a
process of their own): paid once per node for as long as its agent lives. The last lines
put them together for a node of 8 ranks over a run of 1 and of 10 sub-runs.
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runmgr.agents.rank_processes import PRELOAD, RankProcesses, RankStart  # noqa: E402
from trainer.cli import config_from_dict  # noqa: E402
from trainer.plan import ResumePlan  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def e2e_config(save: Path, steps: int):
    """The e2e tests' model (tests/e2e/harness.py), on one rank."""
    return config_from_dict({
        "device": "cpu",
        "model": {"family": "llama", "num_layers": 1, "hidden_size": 64, "ffn_hidden_size": 172,
                  "num_attention_heads": 4, "num_query_groups": 2, "seq_length": 64, "max_position_embeddings": 64},
        "data": {"corpus_max_bytes": 400_000},
        "training": {"micro_batch_size": 2, "global_batch_size": 4, "train_iters": steps, "deterministic": True},
        "checkpoint": {"save": str(save), "save_interval": steps, "async_save": False},
    })


def rank_cpu(start_method: str, ranks: int, steps: int, root: Path) -> list[float]:
    """Each rank's CPU-seconds, started one after the other under ``start_method``."""
    processes = RankProcesses(start_method=start_method)  # type: ignore[arg-type]
    cpu = []
    try:
        for index in range(ranks):
            config = e2e_config(root / f"{start_method}-{index}", steps)
            processes.start(RankStart(config, ResumePlan(), 0, 1, 0, "127.0.0.1", free_port()))
            (end,) = processes.ended(wait_s=600)
            if end.kind != "finished":
                raise SystemExit(f"a {start_method} rank ended as {end.kind}: {end.text}")
            cpu.append(processes.cpu_seconds()[0])
        return cpu
    finally:
        processes.stop(grace_s=5)


def preload_cpu() -> float:
    """The server's imports, in a process of their own (a waited-for child: its CPU is counted)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import " + ", ".join(PRELOAD)], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = rank_cpu("spawn", args.ranks, args.steps, Path(tmp))
        forked = rank_cpu("forkserver", args.ranks, args.steps, Path(tmp))
    server = preload_cpu()
    mean_fresh, mean_forked = sum(fresh) / len(fresh), sum(forked) / len(forked)
    print(f"fresh rank:  {mean_fresh:.2f} CPU-s (each: {', '.join(f'{x:.2f}' for x in fresh)})")
    print(f"forked rank: {mean_forked:.2f} CPU-s (each: {', '.join(f'{x:.2f}' for x in forked)})")
    print(f"server's imports, once per node: {server:.2f} CPU-s")
    print(f"a rank's start: {mean_fresh / mean_forked:.1f}x cheaper forked")
    for subruns in (1, 10):
        starts = 8 * subruns
        print(f"8 ranks x {subruns:2d} sub-run(s): fresh {starts * mean_fresh:6.1f} CPU-s, "
              f"forked {server + starts * mean_forked:6.1f} CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
