"""What a rank needs to resume at a step (a snapshot's content, a donor's message), taken
from the loop's session and put back into it."""

from __future__ import annotations

from trainer.session import Position, Session


def capture(session: Session) -> dict:
    """What a rank needs to resume at the step just completed (trainer/warm.py keeps a host copy).
    The model comes first, the optimizer second: host_state copies them in this order."""
    ctx = session.ctx
    return {"model": session.engine.model.state_dict(), "optimizer": session.engine.optimizer.state_dict(),
            "scaler": session.scaler.state_dict(), "cursor": session.position.cursor,
            # The count, not the list: a copy per step of every loss so far would grow with the run.
            "skipped_samples": session.position.skipped_samples, "losses_count": len(session.losses),
            "start_step": ctx.start_step, "rewarmup_iters": ctx.rewarmup_iters,
            "schedule_origin": ctx.schedule_origin,
            # Measured once, with a collective: a replacement must not measure it again alone.
            "optimizer_bytes": list(session.optimizer_bytes)}


def restore(session: Session, state: dict) -> None:
    """Put a snapshot back (a copy: the optimizer keeps the tensors it is given)."""
    session.engine.load_local_state(state["model"], state["optimizer"])
    session.scaler.load_state_dict(state["scaler"])
    session.position = Position(int(state["cursor"]), int(state["skipped_samples"]))
    if "losses" in state:  # a replacement gets its donor's
        session.losses = [float(loss) for loss in state["losses"]]
    del session.losses[int(state["losses_count"]):]
    session.optimizer_bytes = tuple(int(size) for size in state["optimizer_bytes"])
