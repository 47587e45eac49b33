"""A stand-in for a user's Megatron-LM ``pretrain_gpt.py``, run under torchrun.

It speaks Megatron's flags (a strict argparse: an unknown flag exits 2 with
``unrecognized arguments``), prints Megatron's lines (the iteration line on
the last rank, the save and load lines and the straggler report on rank 0),
writes Megatron's checkpoint layout (``iter_NNNNNNN/`` and
``latest_checkpointed_iteration.txt`` once every rank saved), resumes with
``--load DIR --ckpt-step N`` and ``--no-load-optim``, and skips
``--iterations-to-skip`` as Megatron does: a silent dummy step that consumes
the batch. The ranks meet in a real all-reduce over TCP every iteration (rank 0
in the middle, :class:`Collectives`), so a killed rank breaks the others and a
stopped one stalls them, as in a real job. It trains no model: its loss is a
smooth curve of the iteration, lifted while it trains on a "bad" stretch of its
data, and it imports no torch (a job's start is torchrun's and runmgr's to
handle, not the import of torch in every process of every sub-run of the tests).

How it behaves is set through its environment (``megatron.env``), never
through flags, so that its command line stays Megatron's:

- ``STANDIN_ITER_S``: seconds per iteration (0.05: CPU spent with ``--log-straggler``, whose
  report measures it, else a sleep); ``STANDIN_BUSY_ITERS``: ``a-b``: with ``--log-straggler``, only
  iterations a to b (inclusive) spend it as CPU, the others sleep as long (unset: all of them; a
  rank slowed outside the window is then not told from its peers); ``STANDIN_SKIP_ITER_S``:
  per skipped iteration (the same); ``STANDIN_SAVE_S``: per save (0);
  ``STANDIN_INIT_S``: start-up before anything is printed (0).
- ``STANDIN_BAD_SAMPLES``: ``a-b,c-d``: sample positions [a, b) of the data
  stream are garbage; an iteration that trains on any of them has a spiking
  loss and gradient norm.
- ``STANDIN_EXIT_AFTER``: exit 0 after this iteration (before
  ``--train-iters``), as a job whose loop ends early.
- ``STANDIN_BEHAVIOUR``: ``train`` (default); ``silent`` (print nothing,
  never end); ``garbage`` (print lines that are no Megatron line, exit 0).
- ``STANDIN_SLOW_FINISH_RANK`` / ``STANDIN_SLOW_FINISH_S``: that rank stays
  this long after the last iteration (its save and teardown), printing one
  line at the end, while the others have exited.
- ``STANDIN_LINES``: a JSON file ``{"before": {"N": [lines]}, "instead": {"N": line}}``: the last
  rank prints those lines before iteration N's line, or that line instead of it (a job whose
  output holds absurd numbers).
- ``STANDIN_MARKS``: a directory where each rank writes ``started-SUBRUN-RANK``
  (SUBRUN: ``RUNMGR_STANDIN_SUBRUN`` if set, else the start iteration).

Standard library only: it imports nothing from the project.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LAST = WORLD - 1


COLLECTIVE_TIMEOUT_S = 600.0
"""How long a rank waits on a peer, as gloo's 10 minutes."""


class Collectives:
    """The job's process group: every rank sends its value to rank 0, which answers each with
    all of them. A peer that died closes its connection (the others raise, as gloo's
    "Connection closed by peer"); a stopped peer never sends (the others wait, as in a stalled
    all-reduce). Rank 0 publishes its address in a file named by the sub-run's rendezvous
    (torchrun's ``MASTER_ADDR:MASTER_PORT``, a port runmgr reserves per sub-run) in this
    machine's temporary directory: the stand-in's nodes are processes of one machine."""

    def __init__(self, rendezvous_dir: Path) -> None:
        key = f"{os.environ['MASTER_ADDR']}-{os.environ['MASTER_PORT']}"
        self.key = key
        where = rendezvous_dir / f".standin-rendezvous-{key}"
        self.peers: list[tuple] = []
        self.where = where
        if RANK == 0:
            self._serve(where)
        else:
            self.hub = self._join(where)

    def _serve(self, where: Path) -> None:
        server = socket.create_server(("", 0))
        server.settimeout(COLLECTIVE_TIMEOUT_S)
        where.parent.mkdir(parents=True, exist_ok=True)
        partial = where.with_name(where.name + f".{os.getpid()}")
        partial.write_text(f"{os.environ['MASTER_ADDR']} {server.getsockname()[1]}")
        os.replace(partial, where)
        joined: dict[int, tuple] = {}
        while len(joined) < WORLD - 1:
            conn, _ = server.accept()
            conn.settimeout(COLLECTIVE_TIMEOUT_S)
            reader, writer = conn.makefile("r"), conn.makefile("w")
            key, rank = reader.readline().split()
            if key == self.key:
                joined[int(rank)] = (reader, writer)
        server.close()
        self.peers = [joined[rank] for rank in range(1, WORLD)]

    def _join(self, where: Path) -> tuple:
        deadline = time.monotonic() + COLLECTIVE_TIMEOUT_S
        while True:
            try:
                host, port = where.read_text().split()
                conn = socket.create_connection((host, int(port)), timeout=COLLECTIVE_TIMEOUT_S)
                break
            except (FileNotFoundError, ConnectionRefusedError, ValueError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {RANK}: no rank 0 at {where} within {COLLECTIVE_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
        reader, writer = conn.makefile("r"), conn.makefile("w")
        writer.write(f"{self.key} {RANK}\n")
        writer.flush()
        return reader, writer

    def all_gather(self, value: float) -> list[float]:
        """Every rank's ``value``, in rank order."""
        if RANK != 0:
            reader, writer = self.hub
            writer.write(f"{value!r}\n")
            writer.flush()
            return [float(x) for x in _line(reader, 0).split()]
        values = [value] + [float(_line(reader, rank)) for rank, (reader, _) in enumerate(self.peers, start=1)]
        for _, writer in self.peers:
            writer.write(" ".join(repr(v) for v in values) + "\n")
            writer.flush()
        return values

    def all_reduce(self, value: float) -> float:
        return sum(self.all_gather(value))

    def barrier(self) -> None:
        self.all_gather(0.0)


def _line(reader, rank: int) -> str:
    line = reader.readline()
    if not line:  # in gloo's words, as a real job's survivor prints them
        raise RuntimeError(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                           f"[{os.environ['MASTER_ADDR']}]:{os.environ['MASTER_PORT']} (rank {rank})")
    return line


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def parse_args() -> argparse.Namespace:
    """Megatron's flags that this stand-in honours; any other is an argparse error."""
    parser = argparse.ArgumentParser(description="Megatron-LM pretrain_gpt.py (stand-in)")
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                 "--max-position-embeddings", "--micro-batch-size", "--log-interval", "--save-interval",
                 "--eval-interval", "--eval-iters", "--lr-warmup-iters", "--ckpt-step",
                 "--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        parser.add_argument(flag, type=int, default=None)
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--train-iters", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    for flag in ("--lr", "--min-lr", "--clip-grad", "--weight-decay", "--adam-beta2"):
        parser.add_argument(flag, type=float, default=None)
    parser.add_argument("--save", required=True)
    parser.add_argument("--load", default=None)
    parser.add_argument("--iterations-to-skip", type=int, nargs="+", default=[])
    for flag in ("--no-load-optim", "--override-opt_param-scheduler", "--log-straggler", "--bf16", "--fp16"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args()
    if args.log_interval is None:
        args.log_interval = 1
    return args


def stamp() -> str:
    return f"[{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"


def say(line: str) -> None:
    """One write per line: under torchrun (``python -u``) ``print`` writes the line and its end
    apart, and two ranks printing at once would cut each other's lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def scripted_lines() -> dict:
    path = os.environ.get("STANDIN_LINES")
    return json.loads(Path(path).read_text()) if path else {}


def bad_samples() -> list[tuple[int, int]]:
    spec = os.environ.get("STANDIN_BAD_SAMPLES", "")
    return [tuple(int(x) for x in part.split("-")) for part in spec.split(",") if part]  # type: ignore[misc]


def trains_on_garbage(iteration: int, batch: int) -> bool:
    """Iteration J trains on stream positions [(J-1) x B, J x B)."""
    first, end = (iteration - 1) * batch, iteration * batch
    return any(a < end and first < b for a, b in bad_samples())


def loss_of(iteration: int, lr_scale: float, bad: bool) -> float:
    base = 2.0 + 3.0 * math.exp(-iteration / 60.0) + 0.01 * math.sin(iteration * 1.7) * lr_scale
    return base + (8.0 if bad else 0.0)


def learning_rate(args: argparse.Namespace, iteration: int, since: int) -> float:
    peak = args.lr if args.lr is not None else 1.0e-4
    warmup = args.lr_warmup_iters or 0
    if warmup and iteration - since <= warmup:
        return peak * (iteration - since) / warmup
    return peak


def iteration_line(args: argparse.Namespace, iteration: int, consumed: int, skipped: int, elapsed_s: float,
                   lr: float, loss: float, grad_norm: float) -> str:
    line = (f" {stamp()} iteration {iteration:8d}/{args.train_iters:8d} | consumed samples: {consumed:12d} |")
    if skipped:
        line += f" skipped samples: {skipped:12d} |"
    return line + (f" elapsed time per iteration (ms): {1000 * elapsed_s:.1f} | learning rate: {lr:.6E} |"
                   f" global batch size: {args.global_batch_size:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |"
                   f" grad norm: {grad_norm:.3f} | number of skipped iterations:   0 |"
                   f" number of nan iterations:   0 |")


def straggler_line(times: list[float]) -> str:
    fast = min(range(len(times)), key=times.__getitem__)
    slow = max(range(len(times)), key=times.__getitem__)
    return (f"[{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S')}] | MnRtt/Rnk: {1000 * times[fast]:.2f}ms/"
            f"{fast} | MxRtt/Rnk: {1000 * times[slow]:.2f}ms/{slow} | MnEtpt/Rnk: 1.00TF/{slow} | "
            f"MxEtpt/Rnk: 1.00TF/{fast}")


class State:
    """What a checkpoint holds: the iteration, the data position, the schedule's origin."""

    def __init__(self, iteration: int = 0, consumed: int = 0, skipped: int = 0, schedule_since: int = 0) -> None:
        self.iteration, self.consumed, self.skipped, self.schedule_since = iteration, consumed, skipped, schedule_since


def load(args: argparse.Namespace) -> State:
    if args.load is None:
        return State()
    load_dir = Path(args.load)
    step = args.ckpt_step
    if step is None:
        step = int((load_dir / "latest_checkpointed_iteration.txt").read_text().strip())
    data = json.loads((load_dir / f"iter_{step:07d}" / f"rank_{RANK:02d}.json").read_text())
    state = State(data["iteration"], data["consumed"], data["skipped"], data["schedule_since"])
    if args.no_load_optim:
        state.schedule_since = state.iteration  # Megatron restarts the LR schedule with the optimizer
    if RANK == 0:
        say(f"  successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] at iteration {state.iteration}")
    return state


def save(args: argparse.Namespace, state: State, group: Collectives) -> None:
    if RANK == 0:
        say(f"saving checkpoint at iteration {state.iteration:7d} to {args.save} in torch_dist format")
    folder = Path(args.save) / f"iter_{state.iteration:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    time.sleep(env_float("STANDIN_SAVE_S", 0.0))
    (folder / f"rank_{RANK:02d}.json").write_text(json.dumps(vars(state)))
    group.barrier()
    if RANK == 0:
        (Path(args.save) / "latest_checkpointed_iteration.txt").write_text(str(state.iteration))
        say(f"  successfully saved checkpoint from iteration {state.iteration:7d} to {args.save} [ t 1/1, p 1/1 ]")


def train(args: argparse.Namespace, state: State, group: Collectives) -> None:
    skip = set(args.iterations_to_skip)
    lr_scale = 1.0
    exit_after = int(os.environ.get("STANDIN_EXIT_AFTER", "0")) or None
    while state.iteration < args.train_iters:
        state.iteration += 1
        if state.iteration in skip:  # Megatron's dummy step: the batch is read and dropped, no line,
            time.sleep(env_float("STANDIN_SKIP_ITER_S", env_float("STANDIN_ITER_S", 0.05)))
            state.consumed += args.global_batch_size
            state.skipped += args.global_batch_size
            group.barrier()
            continue  # and the loop goes on at once: no save, no evaluation, no exit check
        one_iteration(args, state, lr_scale, group)
        if args.save_interval and state.iteration % args.save_interval == 0:
            save(args, state, group)
        if exit_after is not None and state.iteration >= exit_after:
            return


def compute(seconds: float, busy: bool) -> None:
    """The forward and backward passes: ``seconds`` of this thread's CPU when ``busy`` (a rank
    slowed by a SIGSTOP/SIGCONT duty cycle then really takes longer, as Megatron's straggler report
    measures), else a sleep (no CPU spent)."""
    if not busy:
        time.sleep(seconds)
        return
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def computes_busy(args: argparse.Namespace, iteration: int) -> bool:
    """Whether ``iteration``'s compute is CPU spent: with ``--log-straggler``, inside
    ``STANDIN_BUSY_ITERS`` when it is set. A job that is only slowed in a known window (a test's
    schedule) spends the CPU where the straggler report must tell a slowed rank, and sleeps as
    long elsewhere: the same iteration times on an idle machine, without burning a core per rank
    for the whole run."""
    window = os.environ.get("STANDIN_BUSY_ITERS")
    if not args.log_straggler or not window:
        return args.log_straggler
    first, last = (int(x) for x in window.split("-"))
    return first <= iteration <= last


def one_iteration(args: argparse.Namespace, state: State, lr_scale: float, group: Collectives) -> None:
    started = time.time()
    compute(env_float("STANDIN_ITER_S", 0.05), busy=computes_busy(args, state.iteration))
    compute_s = time.time() - started
    group.all_reduce(1.0)  # the gradient all-reduce: a lost or stopped peer stalls or breaks it
    times = group.all_gather(compute_s) if args.log_straggler else []
    state.consumed += args.global_batch_size
    bad = trains_on_garbage(state.iteration, args.global_batch_size)
    if RANK == LAST and state.iteration % args.log_interval == 0:
        scripted = scripted_lines()
        for line in scripted.get("before", {}).get(str(state.iteration), []):
            say(line)
        say(scripted.get("instead", {}).get(str(state.iteration)) or
            iteration_line(args, state.iteration, state.consumed, state.skipped, time.time() - started,
                           learning_rate(args, state.iteration, state.schedule_since),
                           loss_of(state.iteration, lr_scale, bad), 6.0 if bad else 0.5))
    if RANK == 0 and times and state.iteration % args.log_interval == 0:
        say(straggler_line(times))


def mark_started(args: argparse.Namespace, state: State) -> None:
    marks = os.environ.get("STANDIN_MARKS")
    if marks:
        tag = os.environ.get("RUNMGR_STANDIN_SUBRUN", str(state.iteration))
        Path(marks, f"started-{tag}-{RANK}").write_text(str(os.getpid()))


def main() -> None:
    args = parse_args()
    behaviour = os.environ.get("STANDIN_BEHAVIOUR", "train")
    time.sleep(env_float("STANDIN_INIT_S", 0.0))
    if behaviour == "silent":
        while True:
            time.sleep(1)
    if behaviour == "garbage":
        for n in range(5):
            say(f"@@@ {n} \x00 not a line Megatron prints iteration abc/def | loss: ??? |")
        return
    group = Collectives(Path(tempfile.gettempdir()))
    state = load(args)
    mark_started(args, state)
    train(args, state, group)
    finished = state.iteration >= args.train_iters
    if finished and args.save_interval and state.iteration % args.save_interval:
        save(args, state, group)  # Megatron saves once more at the end when the interval did not
    group.barrier()  # as the job ends: every rank leaves together
    if RANK == 0:
        group.where.unlink(missing_ok=True)
    if finished and RANK == int(os.environ.get("STANDIN_SLOW_FINISH_RANK", "-1")):
        time.sleep(env_float("STANDIN_SLOW_FINISH_S", 0.0))
        say(f"[after training is done] rank {RANK} finished its teardown")
    sys.exit(0)


if __name__ == "__main__":
    main()
