"""The ``lint`` section: which of ``runmgr lint``'s rules a run silences on
purpose, and how much of the dataset the data rules decode (docs/lint.md).

The rule ids are a closed set (:class:`LintRule`), so ``lint.ignore=[typo]``
fails when the config is composed, with one line naming the ids; the rules
table is here (:data:`RULE_TABLE`), each check in runmgr/lint/, one per id."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainer.config import Choice

# Where each lesson comes from, in words a user can look up: the case reports runmgr was built
# from (docs/lint.md, "Where the lessons come from") and OPT-175B's published logbook.
SEED_000 = "case report 000: LLaMA2-70B on an Ascend NPU cluster"
SEED_004 = "case report 004: a precision-tuning guide for large models"
OPT = "OPT-175B's logbook, Runs 11-12"
REMEDIES = "runmgr's remedies as the job's flags (docs/megatron.md)"


@dataclass(frozen=True)
class RuleEntry:
    """One rule of ``runmgr lint``'s table: what docs/lint.md lists and ``lint.ignore`` names
    (its check lives in runmgr/lint/, keyed by the id)."""

    id: str
    severity: Literal["error", "warning"]
    what: str
    """What it flags, one line (docs/lint.md)."""
    source: str
    """Where the lesson comes from."""


RULE_TABLE: tuple[RuleEntry, ...] = (
    RuleEntry("adam-beta2", "warning", "Adam beta2 >= 0.99 in LLM pretraining (spikes: Adam's update turns unstable)",
         f"{SEED_000}; {OPT}"),
    RuleEntry("adam-eps", "warning", "Adam epsilon >= 1e-6", SEED_000),
    RuleEntry("dropout", "warning", "dropout on in pretraining (hidden or attention)", SEED_000),
    RuleEntry("weight-decay-low", "warning", "weight decay below 0.05 with bf16 (invites loss spikes)", f"{SEED_000}; {OPT}"),
    RuleEntry("decay-1d", "warning", "weight decay applied to biases and 1-D weights (norm gains)", SEED_004),
    RuleEntry("no-warmup", "warning", "no learning-rate warmup", f"{SEED_000}; {OPT}"),
    RuleEntry("peak-lr", "warning", "peak learning rate more than 10x the usual for the tokens per batch", SEED_000),
    RuleEntry("clip-off", "warning", "gradient clipping off", f"{SEED_004}; {OPT}"),
    RuleEntry("fp16-static-loss-scale", "warning", "fp16 without dynamic loss scaling", OPT),
    RuleEntry("tied-from-untied", "error",
         "a tied-embedding model starting from a checkpoint with a separate output layer (loss does not converge)",
         SEED_000),
    RuleEntry("token-range", "error", "token ids outside [0, model.vocab_size) in the decoded data", SEED_004),
    RuleEntry("label-shift", "error", "labels that are not the inputs shifted by one, in the trainer's own split",
         SEED_004),
    RuleEntry("software-versions", "warning", "software versions that differ across the admitted nodes (health check)",
         SEED_000),
    RuleEntry("remedy-lr-cut", "error",
         "a policy rung that lowers the LR, for a Megatron job whose arguments give no --lr to lower", REMEDIES),
)
"""Every rule, in the order ``runmgr lint`` checks them."""
RULE_IDS: tuple[str, ...] = tuple(entry.id for entry in RULE_TABLE)
"""Every rule's id, in that order."""

LintRule = Choice("LintRule", {rule: rule for rule in RULE_IDS})  # type: ignore[misc]
"""A rule id as a config value: OmegaConf refuses any other, naming these."""


@dataclass
class LintConfig:
    """The lint every ``runmgr launch`` (and ``--dry-run``, and ``runmgr lint``) runs."""

    ignore: list[LintRule] = field(default_factory=list)  # type: ignore[valid-type]
    """Rule ids silenced on purpose (``lint.ignore=[dropout]``); each launch records them in the
    logbook as ``lint_ignored`` events. Say why in a comment next to the list."""
    data_sample_windows: int = 64
    """Training windows the data rules take through the trainer's own sample stream and
    input/label split (the first ones of the stream, in the order the trainer reads them)."""
    data_scan_tokens: int = 50_000_000
    """Tokens of the dataset scanned for ids outside [0, model.vocab_size) (from its start; 0: only
    the sampled windows). 50M int32 tokens read in well under a second from a local disk."""

    def ignored(self) -> tuple[str, ...]:
        """The silenced ids as plain strings."""
        return tuple(str(rule) for rule in self.ignore)

    def problems(self) -> list[str]:
        """One line per invalid setting."""
        out = []
        if self.data_sample_windows <= 0:
            out.append(f"lint.data_sample_windows must be a positive integer, got {self.data_sample_windows}")
        if self.data_scan_tokens < 0:
            out.append(f"lint.data_scan_tokens must be >= 0 (0: only the sampled windows), got {self.data_scan_tokens}")
        return out
