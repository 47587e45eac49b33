"""The rules table: each rule's id, severity, what it checks and where the
lesson comes from. The checks live beside it (config_rules, data, checkpoint,
versions); this table is what docs/lint.md lists and ``lint.ignore`` names."""

from __future__ import annotations

from dataclasses import dataclass

from runmgr.lint.findings import Finding, Severity

SEED_000 = "seed 000"
SEED_004 = "seed 004"
OPT = "OPT Run 11/12 lessons"
REMEDIES = "runmgr's remedies as the job's flags (docs/megatron.md)"


@dataclass(frozen=True)
class Rule:
    """One check of ``runmgr lint``."""

    id: str
    severity: Severity
    what: str
    """What it flags, one line (docs/lint.md)."""
    source: str

    def finding(self, message: str, fix: str) -> Finding:
        """This rule's finding, with the values in ``message``."""
        return Finding(self.id, self.severity, message, fix, self.source)


_TABLE = (
    Rule("adam-beta2", "warning", "Adam beta2 >= 0.99 in LLM pretraining (spikes: Adam's update turns unstable)",
         f"{SEED_000}; {OPT}"),
    Rule("adam-eps", "warning", "Adam epsilon >= 1e-6", SEED_000),
    Rule("dropout", "warning", "dropout on in pretraining (hidden or attention)", SEED_000),
    Rule("weight-decay-low", "warning", "weight decay below 0.05 with bf16 (invites loss spikes)", f"{SEED_000}; {OPT}"),
    Rule("decay-1d", "warning", "weight decay applied to biases and 1-D weights (norm gains)", SEED_004),
    Rule("no-warmup", "warning", "no learning-rate warmup", f"{SEED_000}; {OPT}"),
    Rule("peak-lr", "warning", "peak learning rate more than 10x the usual for the tokens per batch", SEED_000),
    Rule("clip-off", "warning", "gradient clipping off", f"{SEED_004}; {OPT}"),
    Rule("fp16-static-loss-scale", "warning", "fp16 without dynamic loss scaling", OPT),
    Rule("tied-from-untied", "error",
         "a tied-embedding model starting from a checkpoint with a separate output layer (loss does not converge)",
         SEED_000),
    Rule("token-range", "error", "token ids outside [0, model.vocab_size) in the decoded data", SEED_004),
    Rule("label-shift", "error", "labels that are not the inputs shifted by one, in the trainer's own split",
         SEED_004),
    Rule("software-versions", "warning", "software versions that differ across the admitted nodes (health check)",
         SEED_000),
    Rule("remedy-lr-cut", "error",
         "a policy rung that lowers the LR, for a Megatron job whose arguments give no --lr to lower", REMEDIES),
)
RULES: dict[str, Rule] = {rule.id: rule for rule in _TABLE}
"""Every rule by id, in the order they are checked (the order of runmgr/config/lint.py's ids)."""
