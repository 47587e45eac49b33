"""The durable tier failing: OPT's "blob storage issues", from the driver's
S3 mirror's attempts.

Each upload attempt is an :class:`UploadObservation`, successful or not. A
failure opens a spell; a success closes it. A spell that lasts
``watcher.storage.outage_after_s`` (the mirror retrying with backoff all the
while) is an outage, reported once, as soon as the spell is that old — by the
next failure or, between attempts, by :meth:`StorageOutageDetector.check`.
The first success after a reported outage reports the recovery (the same
kind, ``recovered``). A spell shorter than the threshold is a blip the
retries absorbed: nothing is reported. Pure: the times are the observations'
and the caller's ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from runmgr.config.watcher import StorageConfig
from runmgr.watch.incidents import STORAGE_OUTAGE, Incident
from runmgr.watch.observations import UploadObservation


@dataclass
class _Spell:
    """Failed attempts since the last success."""

    since: float
    first_step: int
    failures: int
    last_error: str
    pending_steps: tuple[int, ...]
    reported: bool = False


class StorageOutageDetector:
    """Reports an outage of the durable tier, then its end."""

    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self._spell: Optional[_Spell] = None

    def update(self, obs: UploadObservation, now: float) -> list[Incident]:
        """Feed one attempt; the incidents it completes (an outage, or its recovery)."""
        if obs.ok:
            return self._close(obs)
        spell = self._spell
        if spell is None:
            self._spell = _Spell(obs.time, obs.step, 1, obs.error, obs.pending_steps)
        else:
            spell.failures += 1
            spell.last_error, spell.pending_steps = obs.error, obs.pending_steps
        return self.check(now)

    def check(self, now: float) -> list[Incident]:
        """An outage once the open spell is ``outage_after_s`` old (reported once)."""
        spell = self._spell
        if spell is None or spell.reported or now - spell.since < self.config.outage_after_s:
            return []
        spell.reported = True
        lasted = now - spell.since
        return [Incident(
            STORAGE_OUTAGE, now,
            f"S3 uploads have failed for {lasted:.0f} s ({spell.failures} attempt(s), threshold "
            f"{self.config.outage_after_s:g} s); last error: {spell.last_error}",
            onset_step=spell.first_step,
            evidence={"since": spell.since, "failed_s": lasted, "failures": spell.failures,
                      "last_error": spell.last_error, "pending_steps": list(spell.pending_steps),
                      "outage_after_s": self.config.outage_after_s})]

    def _close(self, obs: UploadObservation) -> list[Incident]:
        spell, self._spell = self._spell, None
        if spell is None or not spell.reported:
            return []
        lasted = obs.time - spell.since
        return [Incident(
            STORAGE_OUTAGE, obs.time,
            f"S3 answers again after {lasted:.0f} s: the copy of step {obs.step} verified "
            f"({spell.failures} failed attempt(s) before it)",
            onset_step=spell.first_step, recovered=True,
            evidence={"since": spell.since, "outage_s": lasted, "failures": spell.failures,
                      "recovered_step": obs.step, "pending_steps": list(obs.pending_steps)})]
