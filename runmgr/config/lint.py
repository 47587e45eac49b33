"""The ``lint`` section: which of ``runmgr lint``'s rules a run silences on
purpose, and how much of the dataset the data rules decode (docs/lint.md).

The rule ids are a closed set (:class:`LintRule`), so ``lint.ignore=[typo]``
fails when the config is composed, with one line naming the ids; the rules
themselves live in runmgr/lint/rules.py, one per id."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.config import Choice

RULE_IDS: tuple[str, ...] = (
    "adam-beta2", "adam-eps", "dropout", "weight-decay-low", "decay-1d", "no-warmup", "peak-lr", "clip-off",
    "fp16-static-loss-scale", "tied-from-untied", "token-range", "label-shift", "software-versions",
    "remedy-lr-cut",
)
"""Every rule's id, in the order ``runmgr lint`` checks them."""

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
