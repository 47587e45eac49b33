"""A node agent's side of the push design, without Ray: what one node's agent tells the
driver per interval (:mod:`.report`) and how it sums its ranks' reports up into that
(:mod:`.summary`). docs/scale.md says why: the driver's work then grows with nodes."""
