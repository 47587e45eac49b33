"""Absurd numbers in every field of Megatron's lines: the table the reader's tests, the fuzz test
and the end-to-end test share (a red team's, issue 33). Each case is a line a job could print and
what the reader must refuse in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

BATCH = 8
FIELDS = ("consumed samples", "elapsed time per iteration (ms)", "learning rate", "global batch size", "lm loss",
          "loss scale", "grad norm", "number of skipped iterations", "number of nan iterations")


def iteration_line(step: int, total: int, **replaced: str) -> str:
    """Megatron's iteration line for ``step`` of ``total`` (batch 8, a smooth loss), with the fields
    named in ``replaced`` (spaces as underscores) written as given."""
    values = {"consumed samples": str(step * BATCH), "elapsed time per iteration (ms)": "50.0",
              "learning rate": "1.000000E-03", "global batch size": str(BATCH),
              "lm loss": f"{5.0 - step * 0.01:.6E}", "loss scale": "1.0", "grad norm": "0.500",
              "number of skipped iterations": "0", "number of nan iterations": "0"}
    for key, text in replaced.items():
        values[_field(key)] = text
    return (f" [2026-11-28 10:11:12.000000] iteration {step:8d}/{total:8d} |"
            + "".join(f" {name}: {values[name]} |" for name in FIELDS))


def _field(key: str) -> str:
    name = key.replace("_", " ")
    return "elapsed time per iteration (ms)" if name == "elapsed" else name


@dataclass(frozen=True)
class FieldCase:
    """Iteration ``step``'s own line with one absurd field: the step stays, the field is refused."""

    step: int
    field: str
    raw: str

    def line(self, total: int) -> str:
        return iteration_line(self.step, total, **{self.field.replace(" ", "_"): self.raw})

    @property
    def name(self) -> str:
        return _field(self.field.replace(" ", "_"))


@dataclass(frozen=True)
class LineCase:
    """A whole line the reader must refuse (no step, no checkpoint), printed before iteration ``step``."""

    step: int
    field: str
    text: str
    """The line; ``{total}`` is the run's --train-iters."""

    def line(self, total: int) -> Optional[str]:
        return self.text.format(total=total)


HUGE = "99999999999999999999999"
FIELD_CASES = (
    FieldCase(3, "consumed samples", "-5"),
    FieldCase(4, "consumed samples", str(10**30)),
    FieldCase(5, "lm loss", "-1.000000E+00"),
    FieldCase(6, "lm loss", "abc"),
    FieldCase(7, "grad norm", "-3.000"),
    FieldCase(8, "loss scale", "0.0"),
    FieldCase(9, "loss scale", "-1.0"),
    FieldCase(10, "learning rate", "abc"),
    FieldCase(11, "elapsed", "1e308"),
    FieldCase(12, "elapsed", "-7.0"),
    FieldCase(13, "elapsed", "nan"),
    FieldCase(14, "global batch size", "0"),
    FieldCase(15, "global batch size", str(2**70)),
    FieldCase(16, "number of skipped iterations", "-2"),
    FieldCase(17, "number of nan iterations", str(10**20)),
    FieldCase(18, "learning rate", "inf"),
    FieldCase(19, "loss scale", "inf"),
    FieldCase(20, "grad norm", "-inf"),
    FieldCase(21, "consumed samples", "3.5"),
    FieldCase(22, "consumed samples", "9" * 5000),  # more digits than Python's int() takes
    FieldCase(23, "lm loss", "12ab"),  # not 12
    FieldCase(24, "grad norm", "information"),  # not infinity (no non-finite incident from a word)
    FieldCase(25, "learning rate", "1.2.3"),
    FieldCase(26, "global batch size", "1_024"),
    FieldCase(27, "elapsed", "\x1b[2J"),  # a terminal escape: refused, and kept as text
)
LINE_CASES = (
    LineCase(22, "iteration", f" iteration {HUGE}/{{total}} | consumed samples: 176 | lm loss: 4.0 |"),
    LineCase(23, "iteration", " iteration 9999/{total} | consumed samples: 184 | lm loss: 4.0 |"),
    LineCase(24, "iteration", " iteration        0/{total} | consumed samples: 0 | lm loss: 4.0 |"),
    LineCase(25, "saving iteration", f"saving checkpoint at iteration {HUGE} to /ck in torch_dist format"),
    LineCase(26, "saved iteration", f"  successfully saved checkpoint from iteration {HUGE} to /ck [ t 1/1, p 1/1 ]"),
    LineCase(27, "straggler report", "[2026-11-28 10:11:12] | MnRtt/Rnk: 1.00ms/99999999999 | MxRtt/Rnk: 2.00ms/1 |"),
    LineCase(28, "iteration", f" iteration       28/{HUGE} | consumed samples: 224 | lm loss: 4.0 |"),
    LineCase(29, "loaded iteration", f"  successfully loaded checkpoint from /ck [ t 1/1, p 1/1 ] at iteration {HUGE}"),
    LineCase(1, "iteration", " iteration " + "9" * 5000 + "/{total} | consumed samples: 8 | lm loss: 4.0 |"),
    LineCase(2, "straggler report", "[2026-11-28 10:11:12] | MnRtt/Rnk: 1.2.3ms/3 | MxRtt/Rnk: 2.00ms/1 |"),
    LineCase(30, "saved iteration", "  successfully saved checkpoint from iteration -3 to /ck [ t 1/1, p 1/1 ]"),
)
"""36 absurd values over every field of the iteration line, the save, load and straggler lines.
The iteration lines a job prints are steps 1 to 30: field cases are iterations 3 to 27 with
their own line changed, line cases come before iteration ``step``'s line (several may share one)."""
