"""What the page's header reads from a logbook (logbook/web/sources.py)."""

from __future__ import annotations

from logbook import Logbook
from logbook.web.sources import overview


def test_the_latest_incident_is_the_one_a_remedy_acted_on_not_an_ignored_blip_after_it(tmp_path):
    """The demo ends with a gradient blip decided ``ignore`` after its Adam reset: the header
    names the loss spike that was acted on, as ``runmgr logbook list`` does."""
    with Logbook.open(tmp_path / "runs" / "r") as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        spike = book.record_incident("1.00", "loss_spike", "loss_spike at step 130: persistent", {}, step=130)
        book.record_decision("1.00", spike, "reset_optimizer", "the ladder's last rung", {})
        blip = book.record_incident("1.00", "grad_spike", "grad_spike at step 131: settled", {}, step=131)
        book.record_decision("1.00", blip, "ignore", "recovered by itself", {})
        book.end_subrun("1.00", "restarting", 131, "loss spike")
        latest = overview(book)["last_incident"]
    assert (latest["id"], latest["kind"], latest["step"]) == (spike, "loss_spike", 130)
