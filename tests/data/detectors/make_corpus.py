"""Regenerate the detector-precision corpus beside this file (seeded, deterministic).

    .venv/bin/python tests/data/detectors/make_corpus.py

Every ``NAME.log`` is a synthetic training log written for this project in the line
formats of Megatron-LM's and MindSpeed-LLM's real logs (megatron/training/training.py's
``training_log``, megatron/training/checkpointing.py's save and load lines, ``print_datetime``),
with values drawn from seeded noise; ``NAME.labels.yaml`` beside it says what happened in it
(README.md: the format). ``runmgr watch score tests/data/detectors`` follows each log as
``runmgr watch follow`` would have and compares with the labels.

Line formats (what each generation of the code prints):

- ``legacy``: Megatron-LM v2.x (2021-22, fp16 era): no stamp on the iteration line,
  ``learning rate: 1.500E-04``, ``successfully saved checkpoint at iteration``, loads without
  ranks; ``print_datetime`` lines give the wall clock.
- ``core08``: Megatron core_r0.8 (what MindSpeed-LLM runs on): `` [2024-09-03 14:02:00]`` stamps,
  ``learning rate: 1.500000E-04``, ``saving checkpoint at iteration N to DIR in torch format``,
  ``successfully saved checkpoint from iteration N to DIR``, loaded ``[ t 0, p 0 ]``.
- ``core12``: Megatron-core 0.12-0.15: as core08, with ``[ t 1/8, p 1/1 ]`` on saves and loads
  and ``skipped samples:`` after an ``--iterations-to-skip``.
- ``core16``: Megatron-core 0.16 and later: microsecond stamps on the iteration and save lines.

Megatron never prints a NaN loss (``if avg > 0.0`` / ``>= 0.0``): a NaN shows as the
``lm loss`` field missing, with ``grad norm: nan`` (bf16, nothing skipped) or the skipped and
NaN iteration counts rising (fp16: the scaler skips every step and halves its scale).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).parent
NAN = float("nan")


# --- line formats --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Format:
    name: str
    stamp: Optional[str]
    """strftime of the iteration line's stamp (None: no stamp)."""
    lr: str
    save_stamp: bool = False
    saved: str = "from"
    """``successfully saved checkpoint at|from iteration``."""
    ckpt_format: Optional[str] = "torch_dist"
    """``... in torch_dist format`` on the save line (None: not printed)."""
    ranks: str = "r12"
    """``none``, ``r08`` (loaded ``[ t 0, p 0 ]``, saved without) or ``r12`` (``[ t 1/8, p 1/1 ]``)."""
    skipped_samples: bool = True
    load_infix: str = "distributed "


LEGACY = Format("legacy", None, ".3E", saved="at", ckpt_format=None, ranks="none", skipped_samples=False,
                load_infix="")
CORE08 = Format("core08", "%Y-%m-%d %H:%M:%S", ".6E", ckpt_format="torch", ranks="r08", skipped_samples=False,
                load_infix="")
CORE12 = Format("core12", "%Y-%m-%d %H:%M:%S", ".6E")
CORE16 = Format("core16", "%Y-%m-%d %H:%M:%S.%f", ".6E", save_stamp=True)


@dataclass
class Job:
    """What the job is: its flavor, line format, size and schedule."""

    flavor: str
    fmt: Format
    fp16: bool
    interval: int
    gbs: int
    train_iters: int
    ckpt: str
    tp: int
    pp: int
    world: int
    model: str
    lr_max: float
    lr_min: float
    warmup: int
    tflops_at: Optional[tuple[float, float]] = None
    """(TFLOP/s/GPU, at this ms per iteration): the throughput field, when logged."""
    save_interval: int = 1000
    save_s: float = 25.0
    eval_interval: int = 0
    eval_s: float = 20.0
    seq: int = 4096
    params: float = 8.0
    """Billions of parameters (the model's size, for the preamble)."""

    def lr(self, step: int) -> float:
        if step < self.warmup:
            return self.lr_max * step / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.train_iters - self.warmup))
        return self.lr_min + 0.5 * (self.lr_max - self.lr_min) * (1 + math.cos(math.pi * progress))


class Writer:
    """The log being written: its lines, the wall clock, the job's counters."""

    def __init__(self, job: Job, start: datetime, rng: random.Random) -> None:
        self.job, self.rng = job, rng
        self.t = start.timestamp()
        self.lines: list[str] = []
        self.consumed = 0
        self.skipped_samples = 0
        self.sched = 0
        """Optimizer steps taken: the LR schedule does not advance on a skipped (overflow) step."""

    # clock and plain lines
    def wait(self, seconds: float) -> None:
        self.t += seconds

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, timezone.utc)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def datetime_line(self, what: str) -> None:
        self.add(f"[{what}] datetime: {self.now():%Y-%m-%d %H:%M:%S} ")

    def _ranks(self) -> str:
        return f" [ t 1/{self.job.tp}, p 1/{self.job.pp} ]"

    # Megatron's lines
    def iteration(self, it: int, ms: float, loss: Optional[float], scale: float, grad: Optional[float],
                  skipped: int, nans: int) -> None:
        job, fmt = self.job, self.job.fmt
        head = f" [{self.now().strftime(fmt.stamp)}]" if fmt.stamp else ""
        text = f"{head} iteration {it:8d}/{job.train_iters:8d} | consumed samples: {self.consumed:12d} |"
        if fmt.skipped_samples and self.skipped_samples > 0:
            text += f" skipped samples: {self.skipped_samples:12d} |"
        text += f" elapsed time per iteration (ms): {ms:.1f} |"
        if job.tflops_at is not None:
            tflops, at_ms = job.tflops_at
            text += f" throughput per GPU (TFLOP/s/GPU): {tflops * at_ms / ms:.1f} |"
        text += f" learning rate: {job.lr(self.sched):{fmt.lr}} | global batch size: {job.gbs:5d} |"
        if loss is not None and loss > 0.0:  # Megatron's own filter: a NaN loss is not printed
            text += f" lm loss: {loss:.6E} |"
        text += f" loss scale: {scale:.1f} |"
        if grad is not None:
            text += f" grad norm: {grad:.3f} |"
        text += f" number of skipped iterations: {skipped:3d} | number of nan iterations: {nans:3d} |"
        self.add(text)

    def save(self, it: int, seconds: float) -> None:
        job, fmt = self.job, self.job.fmt
        stamp = f"[{self.now():%Y-%m-%d %H:%M:%S.%f}] " if fmt.save_stamp else ""
        suffix = f" in {fmt.ckpt_format} format" if fmt.ckpt_format else ""
        self.add(f"{stamp}saving checkpoint at iteration {it:7d} to {job.ckpt}{suffix}")
        self.wait(seconds)
        stamp = f"[{self.now():%Y-%m-%d %H:%M:%S.%f}] " if fmt.save_stamp else ""
        ranks = self._ranks() if fmt.ranks == "r12" else ""
        self.add(f"  {stamp}successfully saved checkpoint {fmt.saved} iteration {it:7d} to {job.ckpt}{ranks}")

    def load(self, it: int, seconds: float) -> None:
        job, fmt = self.job, self.job.fmt
        self.add(f" loading {fmt.load_infix}checkpoint from {job.ckpt} at iteration {it}")
        self.wait(seconds)
        ranks = {"none": "", "r08": " [ t 0, p 0 ]", "r12": self._ranks()}[fmt.ranks]
        self.add(f"  successfully loaded checkpoint from {job.ckpt}{ranks} at iteration {it}")
        if fmt.name != "legacy":
            self.add("(min, max) time across ranks (ms):",
                     f"    load-checkpoint ................................: ({seconds * 1000 - 0.6:.2f}, "
                     f"{seconds * 1000:.2f})")

    def validation(self, it: int, loss: float) -> None:
        text = (f" validation loss at iteration {it} | lm loss value: {loss:.6E} | "
                f"lm loss PPL: {math.exp(loss):.6E} | ")
        self.add("-" * (len(text) + 1), text, "-" * (len(text) + 1))
        self.wait(self.job.eval_s * math.exp(self.rng.gauss(0.0, 0.05)))


# --- the job's start -----------------------------------------------------------------------------

STARS = "    " + "*" * 109
"""transfer_to_npu's warning box."""


def preamble(w: Writer, load: Optional[int], banner: bool = True) -> None:
    """What a job prints before its first iteration: torchrun's banner (not when its elastic agent
    restarts the workers), Megatron's initialisation with its ``print_datetime`` lines, the
    checkpoint load (``load``: its iteration; None: from initialisation), the datasets."""
    job, rng = w.job, w.rng
    dp = job.world // (job.tp * job.pp)
    if not banner:
        pass
    elif job.fmt.name == "legacy":
        w.add("*****************************************",
              "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
              "system being overloaded, please further tune the variable for optimal performance in your "
              "application as needed. ",
              "*****************************************")
    else:
        glog = f"W{w.now():%m%d %H:%M:%S}.{rng.randrange(1000):03d}000 {rng.randrange(1000, 99999)} " \
               f"torch/distributed/run.py:793]"
        w.add(f"{glog} ", f"{glog} *****************************************",
              f"{glog} Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid "
              f"your system being overloaded, please further tune the variable for optimal performance in your "
              f"application as needed. ", f"{glog} *****************************************")
    if job.flavor == "mindspeed_llm" and banner:
        w.add("/usr/local/lib/python3.10/dist-packages/torch_npu/contrib/transfer_to_npu.py:301: ImportWarning: ",
              STARS,
              "    The torch.Tensor.cuda and torch.nn.Module.cuda are replaced with torch.Tensor.npu and "
              "torch.nn.Module.npu now..",
              "    The torch.cuda.DoubleTensor is replaced with torch.npu.FloatTensor cause the double type is not "
              "supported now..",
              "    The backend in torch.distributed.init_process_group set to hccl now..",
              STARS)
    w.wait(8 + rng.random() * 4)
    w.add(f"using world size: {job.world}, data-parallel size: {dp}, context-parallel size: 1, "
          f"tensor-model-parallel size: {job.tp}, pipeline-model-parallel size: {job.pp} ",
          "------------------------ arguments ------------------------")
    args = {"bf16": not job.fp16, "fp16": job.fp16, "global_batch_size": job.gbs, "log_interval": job.interval,
            "lr": f"{job.lr_max:g}", "min_lr": f"{job.lr_min:g}", "save": job.ckpt, "load": job.ckpt,
            "save_interval": job.save_interval, "seq_length": job.seq, "train_iters": job.train_iters}
    if job.fp16:
        args.update({"hysteresis": 2, "initial_loss_scale": 4294967296.0, "loss_scale_window": 1000,
                     "min_loss_scale": 1.0})
    for key in sorted(args):
        w.add(f"  {key} {'.' * (48 - len(key))} {args[key]}")
    micro = job.gbs // dp if job.gbs % dp == 0 else 1
    w.add("-------------------- end of arguments ---------------------",
          f"setting number of microbatches to constant {max(1, micro)}",
          "> building HuggingFaceTokenizer tokenizer ..." if job.fmt.name != "legacy"
          else "> building GPT2BPETokenizer tokenizer ...",
          "> initializing torch distributed ...",
          f"> initialized tensor model parallel with size {job.tp}",
          f"> initialized pipeline model parallel with size {job.pp}",
          "> setting random seeds to 1234 ...",
          "> compiling dataset index builder ...")
    w.wait(1 + rng.random())
    w.add(f">>> done with dataset index builder. Compilation time: {0.04 + rng.random() * 0.05:.3f} seconds")
    init_s = 20 + rng.random() * 25
    w.wait(init_s)
    w.add(f"time to initialize megatron (seconds): {init_s + 9:.3f}")
    w.datetime_line("after megatron is initialized")
    w.add(f"building {job.model} model ...",
          f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
          f"{int(job.params * 1e9 / (job.tp * job.pp) * (1 + 0.02 * rng.random()))}")
    w.wait(10 + rng.random() * 8)
    if load is not None:
        w.load(load, 18 + rng.random() * 30)
    w.datetime_line("after model, optimizer, and learning rate scheduler are built")
    w.add("> building train, validation, and test datasets ...",
          " > datasets target sizes (minimum size):",
          f"    train:      {job.train_iters * job.gbs}",
          f"    validation: {(job.train_iters // 1000 + 1) * 10 * job.gbs}",
          f"    test:       {10 * job.gbs}",
          "> finished creating GPT datasets ...")
    w.wait(6 + rng.random() * 10)
    w.datetime_line("after dataloaders are built")
    w.add("done with setup ...", "training ...")
    w.datetime_line("before the start of training step")
    w.consumed = (load or 0) * job.gbs + w.skipped_samples
    w.sched = load or 0


# --- the numbers ---------------------------------------------------------------------------------

@dataclass
class Sample:
    loss: float
    grad: float
    ms: float


@dataclass
class Curve:
    """A healthy run's loss, grad norm and step time, with their noise."""

    loss_inf: float = 1.70
    loss_a: float = 9.0
    loss_alpha: float = 0.38
    loss_sigma: float = 0.010
    bump_p: float = 0.0
    bump: tuple[float, float] = (0.03, 0.06)
    grad_inf: float = 0.22
    grad_b: float = 2.5
    grad_tau: float = 400.0
    grad_sigma: float = 0.10
    blip_p: float = 0.001
    blip: tuple[float, float] = (1.3, 1.8)
    ms: float = 1000.0
    ms_sigma: float = 0.012
    hiccup_p: float = 0.002
    hiccup: tuple[float, float] = (1.2, 1.8)
    ceiling: float = 16.6
    """log2 of the largest loss scale fp16 gradients fit (its drift per 10,000 steps below)."""
    ceiling_drift: float = 0.15
    overflow_p: float = 0.0015
    """Chance of an isolated overflow at a scale just below the ceiling (less at a lower one)."""



@dataclass
class Sim:
    curve: Curve
    rng: random.Random
    effects: list = field(default_factory=list)

    def sample(self, it: int) -> Sample:
        c, rng = self.curve, self.rng
        loss = (c.loss_inf + c.loss_a * (it + 20) ** -c.loss_alpha) * math.exp(rng.gauss(0.0, c.loss_sigma))
        if rng.random() < c.bump_p:  # a batch of unusual data
            loss *= 1 + rng.uniform(*c.bump)
        grad = (c.grad_inf + c.grad_b * math.exp(-it / c.grad_tau)) * math.exp(rng.gauss(0.0, c.grad_sigma))
        if rng.random() < c.blip_p:
            grad *= rng.uniform(*c.blip)
        ms = c.ms * math.exp(rng.gauss(0.0, c.ms_sigma))
        if rng.random() < c.hiccup_p:  # a data-loader stall, a GC pause
            ms *= rng.uniform(*c.hiccup)
        s = Sample(loss, grad, ms)
        for effect in self.effects:
            effect.apply(it, s)
        return s

    def overflows(self, it: int, scale: float) -> bool:
        """Whether fp16 gradients at ``scale`` overflow at ``it``."""
        c = self.curve
        ceiling, extra = c.ceiling - c.ceiling_drift * it / 10_000, 0.0
        for effect in self.effects:
            ceiling, extra = effect.scaler(it, ceiling, extra) if hasattr(effect, "scaler") else (ceiling, extra)
        level = math.log2(scale)
        if level > ceiling + 1:
            p = 0.97
        elif level > ceiling:
            p = 0.45
        else:  # below the ceiling an overflow is rarer the lower the scale: the scaler finds a balance
            p = c.overflow_p * 2.0 ** (1.5 * (level - ceiling))
        return self.rng.random() < max(p, extra)


@dataclass
class Spike:
    """The loss and the grad norm lifted from ``onset``: a peak decaying with ``decay`` steps to
    ``floor`` (0: recovers), the floor growing ``growth`` per step."""

    onset: int
    peak: float
    decay: float
    floor: float = 0.0
    growth: float = 0.0
    grad_peak: float = 6.0
    grad_decay: float = 4.0
    grad_floor: float = 0.0
    rise: int = 2

    def apply(self, it: int, s: Sample) -> None:
        k = it - self.onset
        if k < 0:
            return
        ramp = min(1.0, (k + 1) / self.rise)
        s.loss *= 1 + ramp * (self.peak * math.exp(-max(0, k - self.rise + 1) / self.decay)
                              + self.floor + self.growth * k)
        s.grad *= 1 + ramp * (self.grad_peak * math.exp(-k / self.grad_decay) + self.grad_floor)


@dataclass
class Slow:
    """Iterations ``factor`` x slower from ``onset`` (over ``ramp`` steps), creeping ``creep`` per step."""

    onset: int
    factor: float
    ramp: int = 1
    creep: float = 0.0

    def apply(self, it: int, s: Sample) -> None:
        k = it - self.onset
        if k >= 0:
            s.ms *= 1 + (self.factor - 1) * min(1.0, (k + 1) / self.ramp) + self.creep * k


@dataclass
class NaNFrom:
    """The grad norm climbing over ``precursor`` steps, then NaN loss and gradients from ``onset``."""

    onset: int
    precursor: int = 30
    grad_rise: float = 4.0

    def apply(self, it: int, s: Sample) -> None:
        if it >= self.onset:
            s.loss, s.grad = NAN, NAN
        elif it >= self.onset - self.precursor:
            x = (it - self.onset + self.precursor) / self.precursor
            s.grad *= 1 + self.grad_rise * x * x
            s.loss *= 1 + 0.015 * x * x


@dataclass
class Collapse:
    """fp16 loss-scale collapse from ``onset``: the scale that fits falls ``fall`` (log2) per step,
    overflows grow common, the grad norm and the loss climb."""

    onset: int
    fall: float = 0.12
    overflow_p: float = 0.3
    ramp: int = 150
    loss_rise: float = 0.12
    grad_rise: float = 5.0

    def apply(self, it: int, s: Sample) -> None:
        k = it - self.onset
        if k >= 0:
            x = min(1.0, k / self.ramp)
            s.loss *= 1 + self.loss_rise * x ** 1.5
            s.grad *= 1 + self.grad_rise * x

    def scaler(self, it: int, ceiling: float, extra: float) -> tuple[float, float]:
        """The ceiling lowered, and a chance of overflow whatever the scale."""
        k = it - self.onset
        if k < 0:
            return ceiling, extra
        return ceiling - self.fall * k, max(extra, self.overflow_p * min(1.0, (k + 1) / self.ramp) ** 0.5)


class Scaler:
    """Megatron's DynamicGradScaler (growth x2 after ``window`` clean steps, halving once
    ``hysteresis`` overflows have used up the tracker, never below ``min_scale``)."""

    def __init__(self, scale: float = 2.0 ** 32, hysteresis: int = 2, window: int = 1000,
                 min_scale: float = 1.0, growth: int = 0, tracker: Optional[int] = None) -> None:
        self.scale, self.hysteresis, self.window, self.min_scale = scale, hysteresis, window, min_scale
        self.growth = growth
        self.tracker = hysteresis if tracker is None else tracker
        self.overflowed: list[int] = []

    def update(self, it: int, found_inf: bool) -> None:
        if found_inf:
            self.overflowed.append(it)
            self.growth = 0
            self.tracker -= 1
            if self.tracker <= 0:
                self.scale = max(self.scale / 2, self.min_scale)
        else:
            self.growth += 1
            if self.growth == self.window:
                self.growth, self.tracker = 0, self.hysteresis
                self.scale *= 2

    def first_overflow_from(self, it: int) -> int:
        return next(i for i in self.overflowed if i >= it)


def train(w: Writer, sim: Sim, first: int, last: int, scaler: Optional[Scaler] = None,
          skip: range = range(0), warm_ms: float = 12000.0,
          after_line: Optional[Callable[[int], None]] = None) -> None:
    """Iterations ``first`` to ``last``, one line per log interval, with the job's evaluations
    and saves after their lines; ``skip``: iterations ``--iterations-to-skip`` leaves out."""
    job = w.job
    n = adv = skipped = nans = 0
    ms_sum = loss_sum = 0.0
    grad: Optional[float] = None
    memory_reported = False
    for it in range(first, last + 1):
        if it in skip:  # Megatron's dummy step: the batch is read and dropped, nothing is logged
            w.consumed += job.gbs
            w.skipped_samples += job.gbs
            ms_sum += 35.0
            w.wait(0.035)
            continue
        s = sim.sample(it)
        if it == first:
            s.ms += warm_ms
        overflow = False
        if scaler is not None:
            overflow = math.isnan(s.loss) or sim.overflows(it, scaler.scale)
            scaler.update(it, overflow)
        n += 1
        ms_sum += s.ms
        if overflow:
            skipped += 1
            nans += math.isnan(s.loss)
            grad = None
        else:
            adv += 1
            loss_sum += s.loss
            grad = s.grad
            w.sched += 1
        w.wait(s.ms / 1000.0)
        w.consumed += job.gbs
        if it % job.interval:
            continue
        w.iteration(it, ms_sum / n, loss_sum / adv if adv else None, scaler.scale if scaler else 1.0,
                    grad, skipped, nans)
        if not memory_reported:
            memory_reported = True
            w.add(f"[Rank 0] (after {it} iterations) memory (MB) | allocated: {17000 + w.rng.random() * 4000:.2f} | "
                  f"max allocated: {52000 + w.rng.random() * 9000:.2f} | reserved: 64122.00 | max reserved: 64122.00")
        n = adv = skipped = nans = 0
        ms_sum = loss_sum = 0.0
        w.wait(0.02)
        if job.eval_interval and it % job.eval_interval == 0:
            w.validation(it, sim.sample(it).loss * 0.985)
        if it % job.save_interval == 0:
            w.save(it, job.save_s * math.exp(w.rng.gauss(0.0, 0.15)))
        if after_line is not None:
            after_line(it)


def start(job: Job, when: str, seed: int) -> tuple[Writer, random.Random]:
    rng = random.Random(seed)
    return Writer(job, datetime.fromisoformat(when).replace(tzinfo=timezone.utc), rng), rng


# --- labels --------------------------------------------------------------------------------------

def labels(about: str, flavor: str, incidents: list[dict], silence_at_end_s: int = 0) -> str:
    out = [f"about: {json.dumps(about)}", f"flavor: {flavor}", f"silence_at_end_s: {silence_at_end_s}"]
    if not incidents:
        return "\n".join(out + ["incidents: []"]) + "\n"
    out.append("incidents:")
    for item in incidents:
        out.append(f"  - class: {item['class']}")
        out.append(f"    kinds: [{', '.join(item['kinds'])}]")
        out.append(f"    step: {item['step']}")
        out.append(f"    remedy: [{', '.join(item['remedy'])}]")
        if "within" in item:
            out.append(f"    within: {item['within']}")
    return "\n".join(out) + "\n"


def incident(cls: str, kinds: list[str], step: int, remedy: list[str], lasts_to: Optional[int] = None) -> dict:
    """A label; ``lasts_to``: the last iteration the condition is still there (to the log's end, or
    until the job is stopped): ``within`` then covers it, when longer than the scorer's default
    window, so that the same condition found again is the same incident."""
    item = {"class": cls, "kinds": kinds, "step": step, "remedy": remedy}
    if lasts_to is not None and lasts_to - step > DEFAULT_WITHIN:
        item["within"] = lasts_to - step
    return item


DEFAULT_WITHIN = 200
"""runmgr/score/labels.py's window after the labelled step."""
SPIKE_KINDS = ["loss_spike", "grad_spike"]
ROLLBACK = ["rollback_skip"]
HANG_REMEDY = ["dump_and_restart", "restart"]


# --- the logs --------------------------------------------------------------------------------------

def llama8b_h100(**more) -> Job:
    base = dict(flavor="megatron_lm", fmt=CORE12, fp16=False, interval=10, gbs=1024, train_iters=120_000,
                ckpt="/lustre/ckpt/llama3-8b", tp=2, pp=1, world=128, model="GPT", lr_max=3e-4, lr_min=3e-5,
                warmup=2000, tflops_at=(437.0, 7380.0), save_interval=1000, save_s=35.0, eval_interval=2000,
                eval_s=45.0, seq=8192)
    base.update(more)
    return Job(**base)


def qwen7b_910b(**more) -> Job:
    base = dict(flavor="mindspeed_llm", fmt=CORE08, fp16=False, interval=1, gbs=128, train_iters=50_000,
                ckpt="/home/work/ckpt/qwen25-7b", params=7.6, tp=4, pp=1, world=32, model="GPT", lr_max=1.25e-4,
                lr_min=1.25e-5, warmup=1000, tflops_at=(196.0, 5320.0), save_interval=250, save_s=28.0,
                eval_interval=0, seq=4096)
    base.update(more)
    return Job(**base)


def spike_persistent_megatron() -> tuple[str, str]:
    job = llama8b_h100(eval_interval=0)
    w, rng = start(job, "2025-06-11 02:14:05", 1101)
    onset = 41273
    sim = Sim(Curve(ms=7380.0, ms_sigma=0.006, grad_inf=0.19, grad_b=0.0, loss_sigma=0.009), rng,
              [Spike(onset, peak=0.42, decay=25.0, floor=0.21, growth=-0.00012, grad_peak=9.0, grad_decay=30.0,
                     grad_floor=1.6, rise=3)])
    preamble(w, 38000)
    train(w, sim, 38001, onset + 297)
    # Stopped by hand (scancel) and resubmitted 11 minutes later from the checkpoint at 41000,
    # skipping the data from 100 iterations before the onset to 200 after it.
    w.wait(4.2)
    pid = 54287
    w.add(f"slurmstepd: error: *** STEP 4471203.0 ON gpu-node-017 CANCELLED AT {w.now():%Y-%m-%dT%H:%M:%S} ***",
          f"W{w.now():%m%d %H:%M:%S}.{rng.randrange(1000):03d}000 {pid} torch/distributed/elastic/agent/server/"
          f"api.py:704] Received Signals.SIGTERM death signal, shutting down workers",
          *(f"W{w.now():%m%d %H:%M:%S}.{rng.randrange(1000):03d}000 {pid} torch/distributed/elastic/"
            f"multiprocessing/api.py:897] Sending process {pid + 11 + n} closing signal SIGTERM" for n in range(8)))
    w.wait(11 * 60)
    sim.effects = []
    w.skipped_samples = 0
    preamble(w, 41000)
    train(w, sim, 41001, 43000, skip=range(onset - 100, onset + 200))
    about = ("Megatron-core 0.12 (timestamps), bf16, log interval 10, resumed at 38000: a loss spike at 41273 with "
             "the grad norm x10 that settles ~20% up and stays; stopped by hand 300 steps later and resumed "
             "from 41000 with --iterations-to-skip 41173-41472, clean after")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("spike_persistent", SPIKE_KINDS, onset, ROLLBACK, lasts_to=onset + 297)])


def spike_persistent_mindspeed() -> tuple[str, str]:
    job = qwen7b_910b()
    w, rng = start(job, "2025-03-14 01:02:41", 1202)
    onset = 12655
    sim = Sim(Curve(loss_inf=1.62, ms=5320.0, grad_inf=0.31, grad_b=0.0, loss_sigma=0.011), rng,
              [Spike(onset, peak=0.10, decay=15.0, floor=0.16, growth=0.0006, grad_peak=4.0, grad_decay=20.0,
                     grad_floor=2.2, rise=4)])
    preamble(w, 12000)
    train(w, sim, 12001, onset + 245, warm_ms=21000.0)
    about = ("MindSpeed-LLM (core_r0.8 lines), bf16, log interval 1, resumed at 12000: the loss jumps ~25% at 12655 "
             "with the grad norm x3-6 and keeps climbing (divergence); the job was killed 245 steps later")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [
        incident("spike_persistent", SPIKE_KINDS, onset, ROLLBACK, lasts_to=onset + 245)])


def spike_recovering_megatron() -> tuple[str, str]:
    job = llama8b_h100(fmt=CORE16, interval=1, gbs=256, world=64, train_iters=250_000, tflops_at=(452.0, 3650.0),
                       save_interval=250, save_s=22.0, eval_interval=0, ckpt="/fsx/ckpt/llama3-8b-cpt")
    w, rng = start(job, "2026-02-02 19:40:12", 1303)
    first, second = 90412, 90731
    sim = Sim(Curve(ms=3650.0, ms_sigma=0.015, grad_inf=0.24, grad_b=0.0, loss_sigma=0.012), rng,
              [Spike(first, peak=0.62, decay=5.0, grad_peak=11.0, grad_decay=3.0, rise=2),
               Spike(second, peak=0.33, decay=4.0, grad_peak=5.5, grad_decay=2.5, rise=1)])
    preamble(w, 90000)
    train(w, sim, 90001, 90800, warm_ms=16000.0)
    about = ("Megatron-core 0.16 (microsecond stamps), bf16, log interval 1, resumed at 90000: a loss spike of +60% "
             "at 90412 (grad norm x12) and one of +30% at 90731, each back to normal within ~20 steps")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("spike_recovering", SPIKE_KINDS, first, ["ignore"]),
        incident("spike_recovering", SPIKE_KINDS, second, ["ignore"])])


def spike_recovering_mindspeed() -> tuple[str, str]:
    job = qwen7b_910b(interval=10, gbs=512, world=128, tflops_at=(188.0, 5480.0), save_interval=1000, save_s=40.0,
                      eval_interval=1000, eval_s=35.0, ckpt="/home/work/ckpt/llama2-13b", params=13.0)
    w, rng = start(job, "2024-11-20 08:30:00", 1404)
    onset = 23407
    sim = Sim(Curve(loss_inf=1.66, ms=5480.0, ms_sigma=0.008, grad_inf=0.18, grad_b=0.0), rng,
              [Spike(onset, peak=0.85, decay=4.0, grad_peak=8.0, grad_decay=4.0, rise=3)])
    preamble(w, 20000)
    train(w, sim, 20001, 26000, warm_ms=24000.0)
    about = ("MindSpeed-LLM (core_r0.8 lines), bf16, log interval 10, resumed at 20000: a loss spike of +85% at "
             "23407 (grad norm x9) that is back to normal ~20 steps later")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [
        incident("spike_recovering", SPIKE_KINDS, onset, ["ignore"])])


def collapse_megatron_legacy() -> tuple[str, str]:
    job = Job(flavor="megatron_lm", fmt=LEGACY, fp16=True, interval=10, gbs=1536, train_iters=143_000,
              ckpt="/gpfs/checkpoints/gpt3-13b", params=13.0, tp=8, pp=4, world=512, model="GPT", lr_max=1.0e-4,
              lr_min=1.0e-5,
              warmup=2000, save_interval=500, save_s=60.0)
    w, rng = start(job, "2022-04-02 11:20:31", 1505)
    onset = 32861
    sim = Sim(Curve(loss_inf=1.80, ms=13950.0, ms_sigma=0.006, grad_inf=0.27, grad_b=0.0, ceiling=16.6,
                    overflow_p=0.001), rng, [Collapse(onset, fall=0.11, overflow_p=0.35, ramp=160)])
    scaler = Scaler(scale=65536.0, growth=412, tracker=0)
    preamble(w, 29000)
    train(w, sim, 29001, onset + 300, scaler=scaler, warm_ms=30000.0)
    first = scaler.first_overflow_from(onset)
    about = ("Megatron-LM v2.x (no timestamps), fp16, log interval 10, resumed at 29000: from 32861 the overflows "
             "come faster, the loss scale halves from 65536 to 1 and the skipped iterations climb, the loss and "
             "grad norm rising; killed 300 steps later")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("loss_scale_collapse", ["loss_scale", "loss_spike", "grad_spike"], first,
                 ["rollback_skip", "lower_lr"], lasts_to=onset + 300)])


def collapse_mindspeed() -> tuple[str, str]:
    job = qwen7b_910b(fp16=True, ckpt="/home/work/ckpt/llama2-7b-fp16", params=6.7, tflops_at=(171.0, 4410.0),
                      save_interval=200, save_s=24.0, world=16, gbs=64)
    w, rng = start(job, "2024-07-09 13:05:10", 1606)
    onset = 8517
    sim = Sim(Curve(loss_inf=1.74, ms=4410.0, grad_inf=0.35, grad_b=0.0, ceiling=15.4, overflow_p=0.002), rng,
              [Collapse(onset, fall=0.13, overflow_p=0.32, ramp=120, loss_rise=0.10, grad_rise=4.0)])
    scaler = Scaler(scale=32768.0, growth=655, tracker=0)
    preamble(w, 8000)
    train(w, sim, 8001, onset + 230, scaler=scaler, warm_ms=19000.0)
    first = scaler.first_overflow_from(onset)
    about = ("MindSpeed-LLM (core_r0.8 lines), fp16, log interval 1, resumed at 8000: from ~8517 overflows every few "
             "steps, the loss scale halving from 32768 down to 1, then most iterations skipped; killed 230 steps "
             "later")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [
        incident("loss_scale_collapse", ["loss_scale", "loss_spike", "grad_spike"], first,
                 ["rollback_skip", "lower_lr"], lasts_to=onset + 230)])


def nan_megatron() -> tuple[str, str]:
    job = llama8b_h100(train_iters=200_000, ckpt="/lustre/ckpt/llama3-8b-long", eval_interval=0)
    w, rng = start(job, "2025-08-30 22:07:44", 1707)
    onset = 62437
    sim = Sim(Curve(ms=7390.0, ms_sigma=0.006, grad_inf=0.17, grad_b=0.0), rng,
              [NaNFrom(onset, precursor=40, grad_rise=5.0)])
    preamble(w, 59000)
    train(w, sim, 59001, onset + 183)
    about = ("Megatron-core 0.12 (timestamps), bf16 with --no-check-for-nan-in-loss-and-grad, log interval 10, "
             "resumed at 59000: the grad norm climbs for 40 steps, then from 62437 the loss is NaN (the lm loss "
             "field is no longer printed) and the grad norm is nan; killed 180 steps later")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("nan", ["nonfinite"], onset, ROLLBACK, lasts_to=onset + 183)])


def nan_mindspeed() -> tuple[str, str]:
    job = qwen7b_910b(fp16=True, ckpt="/home/work/ckpt/baichuan2-13b", params=13.9, tflops_at=(163.0, 6980.0), gbs=128,
                      world=32, tp=8, save_interval=250, save_s=36.0)
    w, rng = start(job, "2024-05-21 04:48:19", 1808)
    onset = 15583
    sim = Sim(Curve(loss_inf=1.77, ms=6980.0, grad_inf=0.29, grad_b=0.0, ceiling=14.8), rng,
              [NaNFrom(onset, precursor=25, grad_rise=3.0)])
    scaler = Scaler(scale=16384.0, growth=130, tracker=0)
    preamble(w, 15000)
    train(w, sim, 15001, onset + 110, scaler=scaler, warm_ms=23000.0)
    about = ("MindSpeed-LLM (core_r0.8 lines), fp16, log interval 1, resumed at 15000: from 15583 every step's loss "
             "is NaN: each iteration skipped and counted as a nan iteration, the loss scale halving to 1; killed "
             "110 steps later")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [
        incident("nan", ["nonfinite", "loss_scale"], onset, ROLLBACK, lasts_to=onset + 110)])


def slowdown_megatron() -> tuple[str, str]:
    job = llama8b_h100(fmt=CORE16, train_iters=300_000, ckpt="/fsx/ckpt/llama3-8b-mix", tflops_at=(441.0, 7310.0),
                       eval_interval=2000)
    w, rng = start(job, "2026-04-17 06:00:03", 1909)
    onset = 104318
    sim = Sim(Curve(ms=7310.0, ms_sigma=0.007, grad_inf=0.16, grad_b=0.0), rng,
              [Slow(onset, factor=1.62, ramp=1, creep=0.00012)])
    preamble(w, 100000)
    train(w, sim, 100001, 106000)
    about = ("Megatron-core 0.16 (microsecond stamps), bf16, log interval 10, resumed at 100000: from 104318 every "
             "iteration takes ~1.6x as long and creeps up to ~1.8x (a throttled node, not named), the loss fine")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("slowdown", ["slowdown", "straggler"], onset, ["restart"], lasts_to=106000)])


def slowdown_mindspeed() -> tuple[str, str]:
    job = qwen7b_910b(train_iters=20_000, ckpt="/home/work/ckpt/qwen25-7b-sft", save_interval=250)
    w, rng = start(job, "2025-01-06 15:12:55", 2010)
    onset = 3541
    sim = Sim(Curve(loss_inf=1.60, ms=5320.0, grad_inf=0.30, grad_b=0.0, ms_sigma=0.014), rng,
              [Slow(onset, factor=1.9, ramp=35)])
    preamble(w, 3000)
    train(w, sim, 3001, 3800, warm_ms=21000.0)
    about = ("MindSpeed-LLM (core_r0.8 lines), bf16, log interval 1, resumed at 3000: from 3541 the iteration time "
             "climbs over ~35 steps to ~1.9x and stays there (a degraded node, not named), the loss fine")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [
        incident("slowdown", ["slowdown", "straggler"], onset, ["restart"], lasts_to=3800)])


def hang_restart_megatron() -> tuple[str, str]:
    job = llama8b_h100(save_interval=500, eval_interval=0, ckpt="/lustre/ckpt/llama3-8b-v2")
    w, rng = start(job, "2025-10-03 09:31:50", 2111)
    sim = Sim(Curve(ms=7380.0, ms_sigma=0.006, grad_inf=0.18, grad_b=0.0), rng)
    last = 71730
    preamble(w, 69000)
    train(w, sim, 69001, last)
    # Iteration 71731 never ends: a rank is stuck in a collective. NCCL's watchdog takes the
    # processes down after its 30-minute timeout and torchrun (--max-restarts 3) starts them again.
    w.wait(1800 + rng.random() * 3)
    glog = f"{w.now():%m%d %H:%M:%S}"
    seq = 2_204_117
    fractions = sorted(rng.randrange(10**9) for _ in range(4))
    for rank, fraction in zip((0, 3, 5), fractions):
        w.add(f"[rank{rank}]:[E{glog}.{fraction:09d} ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog "
              f"caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
              f"NumelOut=1048576, Timeout(ms)=1800000) ran for {1800000 + rng.randrange(20, 90)} milliseconds "
              f"before timing out.")
    w.add(f"[rank3]:[E{glog}.{fractions[3]:09d} ProcessGroupNCCL.cpp:698] [Rank 3] To avoid data "
          f"inconsistency, we are taking the entire process down.")
    w.wait(6)
    pid = 211734
    w.add(f"W{w.now():%m%d %H:%M:%S}.{rng.randrange(10**6):06d} {pid} torch/distributed/elastic/multiprocessing/"
          f"api.py:897] Sending process {pid + 9} closing signal SIGTERM",
          f"E{w.now():%m%d %H:%M:%S}.{rng.randrange(10**6):06d} {pid} torch/distributed/elastic/multiprocessing/"
          f"api.py:869] failed (exitcode: -6) local_rank: 3 (pid: {pid + 12}) of binary: /usr/bin/python3",
          f"W{w.now():%m%d %H:%M:%S}.{rng.randrange(10**6):06d} {pid} torch/distributed/elastic/agent/server/"
          f"api.py:718] [default] Worker group FAILED. 3/3 attempts left; will restart worker group")
    w.wait(4)
    preamble(w, 71500, banner=False)
    train(w, sim, 71501, 72600)
    about = ("Megatron-core 0.12 (timestamps), bf16, log interval 10, resumed at 69000: the lines stop after 71730; "
             "30 minutes later NCCL's watchdog times out and torchrun restarts the job from the checkpoint at "
             "71500, which trains on")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("hang", ["hang", "worker_death"], last, HANG_REMEDY)])


def hang_restart_mindspeed() -> tuple[str, str]:
    job = qwen7b_910b(ckpt="/home/work/ckpt/qwen25-14b", params=14.7, tp=8, world=64, gbs=256,
                      tflops_at=(201.0, 6110.0),
                      save_interval=250, save_s=33.0)
    w, rng = start(job, "2025-05-30 20:16:08", 2212)
    sim = Sim(Curve(loss_inf=1.58, ms=6110.0, grad_inf=0.27, grad_b=0.0), rng)
    last = 40612
    preamble(w, 40200)
    train(w, sim, 40201, last, warm_ms=26000.0)
    # The job's own launcher (a wrapper that watches the log) kills it after 20 minutes without a
    # line and starts it again; the job resumes from its newest checkpoint.
    w.wait(1200 + 7)
    w.add(f"[{w.now():%Y-%m-%d %H:%M:%S}] [run_qwen.sh] no new log line for 1207 s: stopping the job "
          f"(pdsh: kill -TERM on 8 nodes), attempt 1 of 5")
    w.wait(35)
    w.add(f"[{w.now():%Y-%m-%d %H:%M:%S}] [run_qwen.sh] all ranks gone; relaunching torchrun --nnodes 8 "
          f"--nproc_per_node 8 pretrain_gpt.py (resume from the latest checkpoint)")
    w.wait(3)
    preamble(w, 40500)
    train(w, sim, 40501, 41000, warm_ms=27000.0)
    about = ("MindSpeed-LLM (core_r0.8 lines), bf16, log interval 1, resumed at 40200: the lines stop after 40612; "
             "the job's launcher kills it after 20 minutes of silence and restarts it from the checkpoint at "
             "40500, which trains on")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [
        incident("hang", ["hang"], last, HANG_REMEDY)])


def hang_end_megatron() -> tuple[str, str]:
    job = llama8b_h100(fmt=CORE16, interval=1, gbs=256, world=64, train_iters=250_000, tflops_at=(449.0, 3670.0),
                       save_interval=250, save_s=22.0, eval_interval=0, ckpt="/fsx/ckpt/llama3-8b-cpt2")
    w, rng = start(job, "2026-03-09 12:01:33", 2313)
    sim = Sim(Curve(ms=3670.0, ms_sigma=0.015, grad_inf=0.23, grad_b=0.0), rng)
    last = 51437
    preamble(w, 51000)
    train(w, sim, 51001, last, warm_ms=15000.0)
    about = ("Megatron-core 0.16 (microsecond stamps), bf16, log interval 1, resumed at 51000: the lines stop after "
             "51437 and the log ends; the job was killed 45 minutes later")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [
        incident("hang", ["hang"], last, HANG_REMEDY)], silence_at_end_s=2700)


def clean_megatron_core16() -> tuple[str, str]:
    job = llama8b_h100(fmt=CORE16, train_iters=200_000, ckpt="/fsx/ckpt/llama3-8b-main", tflops_at=(446.0, 7340.0))
    w, rng = start(job, "2026-01-12 00:00:07", 2414)
    sim = Sim(Curve(ms=7340.0, ms_sigma=0.007, grad_inf=0.21, grad_b=0.0, blip_p=0.002), rng)
    stop = 150_000

    def exit_duration(it: int) -> None:
        if it == stop:  # --exit-duration-in-mins: saved (a save-interval step), then exit; the next job resumes
            w.datetime_line(f"exiting program after {(w.t - started) / 60 + 1.2876431} minutes")
    preamble(w, 132000)
    started = w.t
    train(w, sim, 132001, stop, after_line=exit_duration)
    w.wait(150)
    preamble(w, stop)
    train(w, sim, stop + 1, 150_000 + 1500)
    about = ("Megatron-core 0.16 (microsecond stamps), bf16, log interval 10, resumed at 132000, 19,500 iterations: "
             "clean; the job exits by --exit-duration-in-mins at 150000 (after a save) and the next one resumes "
             "there 4 minutes later")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [])


def clean_megatron_legacy() -> tuple[str, str]:
    job = Job(flavor="megatron_lm", fmt=LEGACY, fp16=True, interval=1, gbs=512, train_iters=300_000,
              ckpt="/mnt/nfs/checkpoints/gpt2-1.3b", params=1.3, tp=2, pp=1, world=32, model="GPT", lr_max=2e-4,
              lr_min=2e-5,
              warmup=375, save_interval=500, save_s=18.0, seq=2048)
    w, rng = start(job, "2022-01-25 17:44:02", 2515)
    sim = Sim(Curve(loss_inf=2.35, loss_a=30.0, loss_alpha=0.45, loss_sigma=0.012, grad_inf=0.35, grad_b=6.0,
                    grad_tau=220.0, ms=905.0, ms_sigma=0.02, ceiling=16.5, overflow_p=0.003), rng)
    scaler = Scaler()

    def timers(it: int) -> None:
        if it % 100 == 0:
            w.add(f"time (ms) | forward-compute: {231 + rng.random() * 9:.2f} | backward-compute: "
                  f"{472 + rng.random() * 14:.2f} | backward-params-all-reduce: {96 + rng.random() * 8:.2f} | "
                  f"optimizer: {48 + rng.random() * 4:.2f} | batch-generator: {2 + rng.random():.2f}")
    preamble(w, None)
    train(w, sim, 1, 2000, scaler=scaler, warm_ms=9000.0, after_line=timers)
    about = ("Megatron-LM v2.x (no timestamps), fp16, log interval 1, from initialisation, 2,000 iterations: "
             "clean: the scaler's initial search from 2^32, then occasional isolated overflows and the growth "
             "every 1000 clean steps")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [])


def clean_mindspeed_bf16() -> tuple[str, str]:
    job = qwen7b_910b(eval_interval=500, eval_s=14.0, ckpt="/home/work/ckpt/qwen25-7b-main")
    w, rng = start(job, "2025-02-17 10:21:37", 2616)
    sim = Sim(Curve(loss_inf=1.61, ms=5320.0, grad_inf=0.29, grad_b=0.0, loss_sigma=0.011, blip_p=0.002), rng)
    preamble(w, 30000)
    train(w, sim, 30001, 31600, warm_ms=22000.0)
    about = "MindSpeed-LLM (core_r0.8 lines), bf16, log interval 1, resumed at 30000, 1,600 iterations: clean"
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [])


def clean_noisy_megatron() -> tuple[str, str]:
    job = llama8b_h100(interval=1, gbs=128, world=16, tp=1, train_iters=60_000, warmup=500, tflops_at=(405.0, 2470.0),
                       save_interval=250, save_s=14.0, eval_interval=500, eval_s=9.0, seq=4096,
                       ckpt="/scratch/ckpt/llama-1b-ablation", params=1.2, lr_max=6e-4, lr_min=6e-5)
    w, rng = start(job, "2025-09-18 13:37:00", 2717)
    sim = Sim(Curve(loss_inf=2.30, loss_sigma=0.024, bump_p=0.004, bump=(0.04, 0.12), grad_inf=0.42, grad_b=0.0,
                    grad_sigma=0.20, blip_p=0.004, blip=(1.5, 3.2), ms=2470.0, ms_sigma=0.03, hiccup_p=0.006,
                    hiccup=(1.3, 2.4)), rng)
    preamble(w, 7000)
    train(w, sim, 7001, 8600, warm_ms=11000.0)
    about = ("Megatron-core 0.12 (timestamps), bf16, log interval 1, a small-batch ablation resumed at 7000, 1,600 "
             "iterations: noisy but healthy (loss noise ~2.4% with one-step data bumps of +4-12%, grad-norm "
             "blips to ~3x, data-loader stalls)")
    return "\n".join(w.lines) + "\n", labels(about, "megatron_lm", [])


def clean_mindspeed_fp16() -> tuple[str, str]:
    job = qwen7b_910b(fp16=True, interval=10, gbs=512, world=64, tp=8, train_iters=100_000, tflops_at=(169.0, 9120.0),
                      save_interval=1000, save_s=41.0, eval_interval=2000, eval_s=30.0,
                      ckpt="/home/work/ckpt/llama2-13b-fp16",
                      params=13.0)
    w, rng = start(job, "2024-08-02 07:55:20", 2818)
    sim = Sim(Curve(loss_inf=1.69, ms=9120.0, ms_sigma=0.008, grad_inf=0.22, grad_b=0.0, ceiling=15.9,
                    overflow_p=0.0015), rng)
    scaler = Scaler(scale=32768.0, growth=377, tracker=0)
    preamble(w, 40000)
    train(w, sim, 40001, 52000, scaler=scaler, warm_ms=30000.0)
    about = ("MindSpeed-LLM (core_r0.8 lines), fp16, log interval 10, resumed at 40000, 12,000 iterations: clean, "
             "with isolated overflows and the scaler's growth and halving around 32768")
    return "\n".join(w.lines) + "\n", labels(about, "mindspeed_llm", [])


LOGS = {
    "spike_persistent_megatron_bf16_i10": spike_persistent_megatron,
    "spike_persistent_mindspeed_bf16_i1": spike_persistent_mindspeed,
    "spike_recovering_megatron_bf16_i1": spike_recovering_megatron,
    "spike_recovering_mindspeed_bf16_i10": spike_recovering_mindspeed,
    "loss_scale_collapse_megatron_fp16_i10": collapse_megatron_legacy,
    "loss_scale_collapse_mindspeed_fp16_i1": collapse_mindspeed,
    "nan_megatron_bf16_i10": nan_megatron,
    "nan_mindspeed_fp16_i1": nan_mindspeed,
    "slowdown_megatron_bf16_i10": slowdown_megatron,
    "slowdown_mindspeed_bf16_i1": slowdown_mindspeed,
    "hang_restart_megatron_bf16_i10": hang_restart_megatron,
    "hang_restart_mindspeed_bf16_i1": hang_restart_mindspeed,
    "hang_end_megatron_bf16_i1": hang_end_megatron,
    "clean_megatron_bf16_i10": clean_megatron_core16,
    "clean_megatron_fp16_i1": clean_megatron_legacy,
    "clean_mindspeed_bf16_i1": clean_mindspeed_bf16,
    "clean_noisy_megatron_bf16_i1": clean_noisy_megatron,
    "clean_mindspeed_fp16_i10": clean_mindspeed_fp16,
}


def main() -> None:
    for old in [*HERE.glob("*.log"), *HERE.glob("*.labels.yaml")]:
        old.unlink()
    for name, make in LOGS.items():
        log, label = make()
        (HERE / f"{name}.log").write_text(log)
        (HERE / f"{name}.labels.yaml").write_text(label)


if __name__ == "__main__":
    main()
