import itertools

import pytest
import torch

from health.config import ComputeChecks
from health.findings import Severity
from health.probes.compute import ComputeProbeError, benchmark_device, matmul_tflops, memory_gbps, probe_compute


def ticking(step):
    """A clock that advances ``step`` seconds per reading."""
    counter = itertools.count()
    return lambda: next(counter) * step


def test_figures_follow_from_the_clock():
    # every timed call spans exactly one tick of 0.5 s
    assert matmul_tflops(size=64, repeats=3, clock=ticking(0.5)) == pytest.approx(
        2 * 64 ** 3 / 0.5 / 1e12)
    assert memory_gbps(megabytes=1.0, repeats=2, clock=ticking(0.25)) == pytest.approx(
        2 * 250_000 * 4 / 0.25 / 1e9)


def this_hosts_accelerator() -> str:
    """What torch itself reports, read apart from the code under test."""
    if torch.accelerator.is_available():
        return f"{torch.accelerator.current_accelerator().type}:0"
    return "cpu"


def test_the_real_benchmark_measures_this_cpu():
    torch.set_num_threads(1)
    result = probe_compute(ComputeChecks(device="cpu", matmul_size=128, repeats=2, bandwidth_mb=4.0))
    assert result.findings[0].severity is Severity.OK
    assert result.figures["compute.matmul_tflops"] > 0
    assert result.figures["compute.memory_gbps"] > 0
    assert result.facts == {"compute.device": "cpu", "compute.dtype": "float32"}


def test_by_default_the_benchmark_runs_on_the_node_s_accelerator_or_its_cpu():
    assert ComputeChecks().device == "auto"
    assert str(benchmark_device("auto")) == this_hosts_accelerator()
    assert str(benchmark_device("cpu")) == "cpu"
    result = probe_compute(ComputeChecks(matmul_size=64, repeats=1, bandwidth_mb=1.0))
    assert result.facts["compute.device"] == this_hosts_accelerator()


def test_bfloat16_runs_in_that_dtype():
    assert matmul_tflops(dtype="bfloat16", size=64, repeats=1) > 0


def test_an_unknown_dtype_names_the_key_and_the_choices():
    with pytest.raises(ComputeProbeError, match=r"health.compute.dtype: .*float32, bfloat16"):
        matmul_tflops(dtype="fp8")


def test_an_unusable_device_fails_the_node_with_the_reason():
    (finding,) = probe_compute(ComputeChecks(device="nodevice:0", matmul_size=8)).findings
    assert finding.severity is Severity.FAIL and finding.code == "compute.device_error"
    assert "nodevice:0" in finding.message


def test_a_cpu_benchmark_runs_on_the_configured_threads_and_gives_the_caller_s_back():
    # A busy neighbour stalls a multi-threaded matmul (its threads wait for each other):
    # the benchmark runs single-threaded by default, and the process keeps its setting.
    torch.set_num_threads(2)
    seen = []

    def clock():
        seen.append(torch.get_num_threads())
        return float(len(seen))

    probe_compute(ComputeChecks(device="cpu", matmul_size=16, repeats=2, bandwidth_mb=0.1), clock)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
    seen.clear()
    probe_compute(ComputeChecks(device="cpu", matmul_size=16, repeats=2, bandwidth_mb=0.1, cpu_threads=2), clock)
    assert set(seen) == {2}
