"""Probes: plain functions that look at this node (devices, storage, data,
software, compute, collectives) and return a ProbeResult. Each bounds its own
time, so that nothing can hang the check."""
