import pytest

from health.findings import Severity
from health.parsers import nvidia_smi


def judged(text):
    _, gpus = nvidia_smi.parse_query(text)
    return {gpu.bus_id: {f.code: f for f in nvidia_smi.ecc_findings(nvidia_smi.ecc_from_query(gpu))}
            for gpu in gpus}


def test_query_tree_keeps_sections_apart(fixture_text):
    header, gpus = nvidia_smi.parse_query(fixture_text("nvidia_smi/q_a100_ok.txt"))
    assert header["Driver Version"] == "535.104.05"
    assert [g.bus_id for g in gpus] == ["00000000:07:00.0", "00000000:0F:00.0"]
    tree = gpus[0].tree
    assert tree["Product Name"] == "NVIDIA A100-SXM4-80GB"
    assert tree["ECC Mode"]["Pending"] == "Enabled"      # "Pending" under ECC Mode ...
    assert tree["Remapped Rows"]["Pending"] == "No"      # ... and under Remapped Rows


def test_healthy_a100_with_some_correctable_errors_passes(fixture_text):
    _, gpus = nvidia_smi.parse_query(fixture_text("nvidia_smi/q_a100_ok.txt"))
    ecc = nvidia_smi.ecc_from_query(gpus[0])
    assert (ecc.volatile_correctable, ecc.volatile_uncorrectable) == (177, 0)
    assert judged(fixture_text("nvidia_smi/q_a100_ok.txt")) == {
        "00000000:07:00.0": {}, "00000000:0F:00.0": {}}


def test_remapped_row_failure_and_dram_uncorrectable_fail(fixture_text):
    result = judged(fixture_text("nvidia_smi/q_a100_remap_failure.txt"))
    first = result["00000000:07:00.0"]
    assert first["gpu.row_remap.failed"].severity is Severity.FAIL
    assert first["gpu.ecc.uncorrectable"].severity is Severity.FAIL
    assert first["gpu.ecc.uncorrectable"].evidence["count"] == 3
    assert "gpu.ecc.aggregate_uncorrectable" not in first  # not said twice
    second = result["00000000:0F:00.0"]
    assert second["gpu.ecc.correctable_high"].severity is Severity.WARN  # 15003 > 10000
    assert second["gpu.ecc.reset_pending"].severity is Severity.WARN
    assert all(f.severity is Severity.WARN for f in second.values())


def test_h100_layout_sums_parity_and_sec_ded_and_reads_the_sram_threshold(fixture_text):
    _, (gpu,) = nvidia_smi.parse_query(fixture_text("nvidia_smi/q_h100_sram_threshold.txt"))
    ecc = nvidia_smi.ecc_from_query(gpu)
    assert ecc.aggregate_uncorrectable == 6 and ecc.sram_threshold_exceeded is True
    (finding,) = nvidia_smi.ecc_findings(ecc)
    assert finding.code == "gpu.ecc.rma" and "RMA" in finding.message


def test_not_available_counters_are_skipped_not_zero(fixture_text):
    _, (gpu,) = nvidia_smi.parse_query(fixture_text("nvidia_smi/q_h100_na.txt"))
    ecc = nvidia_smi.ecc_from_query(gpu)
    assert ecc.volatile_uncorrectable is None and ecc.aggregate_correctable is None
    assert nvidia_smi.ecc_findings(ecc) == []


def test_pre_ampere_double_bit_totals_and_pending_blacklist(fixture_text):
    result = judged(fixture_text("nvidia_smi/q_v100_double_bit.txt"))
    assert result["00000000:1A:00.0"] == {}
    bad = result["00000000:1B:00.0"]
    assert bad["gpu.ecc.uncorrectable"].evidence["count"] == 3
    assert "page retirement" in bad["gpu.ecc.reset_pending"].message


def test_query_gpu_csv_with_units_and_not_available_fields(fixture_text):
    rows = nvidia_smi.parse_query_csv(fixture_text("nvidia_smi/query_gpu.csv"))
    assert [r["pci.bus_id"] for r in rows] == [
        "00000000:07:00.0", "00000000:0F:00.0", "00000000:41:00.0"]
    assert rows[0]["memory.total"] == 81920.0  # "memory.total [MiB]" -> "memory.total"
    assert rows[2]["ecc.errors.uncorrected.volatile.total"] is None  # [N/A]
    verdicts = {r["pci.bus_id"]: nvidia_smi.ecc_findings(nvidia_smi.ecc_from_csv_row(r))
                for r in rows}
    assert verdicts["00000000:07:00.0"] == [] and verdicts["00000000:41:00.0"] == []
    assert verdicts["00000000:0F:00.0"][0].code == "gpu.ecc.uncorrectable"


def test_query_csv_without_header_takes_the_field_list(fixture_text):
    fields = ["index", "name", "pci.bus_id", "memory.total",
              "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
              "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending"]
    rows = nvidia_smi.parse_query_csv(fixture_text("nvidia_smi/query_gpu_noheader.csv"), fields)
    assert rows[1]["ecc.errors.corrected.volatile.total"] == 177.0
    assert rows[1]["retired_pages.pending"] is None


def test_remapped_rows_csv_failure_fails_and_pending_warns(fixture_text):
    rows = nvidia_smi.parse_query_csv(fixture_text("nvidia_smi/query_remapped_rows.csv"))
    codes = {r["gpu_bus_id"]: [f.code for f in nvidia_smi.ecc_findings(
        nvidia_smi.ecc_from_csv_row(r))] for r in rows}
    assert codes == {"00000000:07:00.0": [],
                     "00000000:0F:00.0": ["gpu.ecc.reset_pending"],
                     "00000000:47:00.0": ["gpu.row_remap.failed"]}


def test_tool_complaints_become_findings(fixture_text):
    (lost,) = nvidia_smi.error_findings(fixture_text("nvidia_smi/lost_gpu.txt"), 255)
    assert lost.code == "gpu.lost" and lost.severity is Severity.FAIL
    assert "0000:2B:00.0" in lost.evidence["line"]
    (driver,) = nvidia_smi.error_findings(fixture_text("nvidia_smi/no_driver.txt"), 9)
    assert driver.code == "gpu.driver"
    (other,) = nvidia_smi.error_findings("Segmentation fault\n", 139)
    assert other.code == "gpu.smi_failed" and "139" in other.message
    assert nvidia_smi.error_findings("", 0) == []


# q_h100_real.txt: `nvidia-smi -q` of a real H100 80GB HBM3 (driver 580.159.04,
# CUDA 13.0), serial number, UUID and PDI masked.
H100_REAL = "nvidia_smi/q_h100_real.txt"


def test_the_real_h100_query_parses_with_its_sections_apart(fixture_text):
    header, (gpu,) = nvidia_smi.parse_query(fixture_text(H100_REAL))
    assert (header["Driver Version"], header["CUDA Version"]) == ("580.159.04", "13.0")
    assert gpu.bus_id == "00000000:00:06.0"
    tree = gpu.tree
    assert tree["Product Name"] == "NVIDIA H100 80GB HBM3"
    # "Pending" is a key of five sections; each keeps its own.
    assert tree["MIG Mode"]["Pending"] == "Disabled" and tree["ECC Mode"]["Pending"] == "Enabled"
    assert tree["Remapped Rows"]["Pending"] == "No"
    # A header with a trailing space, and a key with a value and deeper lines under it.
    assert tree["GPU Memory Power Readings"]["Average Power Draw"] == "38.72 W"
    assert tree["Clocks Event Reasons"]["HW Thermal Slowdown"] == "Not Active"
    assert tree["FB Memory Usage"]["Total"] == "81559 MiB"


def test_the_real_h100_is_clean_and_its_new_flags_are_read(fixture_text):
    _, (gpu,) = nvidia_smi.parse_query(fixture_text(H100_REAL))
    ecc = nvidia_smi.ecc_from_query(gpu)
    assert (ecc.volatile_correctable, ecc.volatile_uncorrectable) == (0, 0)
    assert (ecc.aggregate_correctable, ecc.aggregate_uncorrectable) == (0, 0)
    assert ecc.ecc_enabled is True and ecc.sram_threshold_exceeded is False
    assert (ecc.remap_pending, ecc.remap_failure, ecc.remapped_uncorrectable) == (False, False, 0)
    assert ecc.retired_pending is None  # "Pending Page Blacklist : N/A" on HBM3
    assert (ecc.repair_pending, ecc.unrepairable_memory) == (False, False)
    assert nvidia_smi.ecc_findings(ecc) == [] and nvidia_smi.recovery_findings(gpu) == []


def _with(text, key, value):
    """The real output with one ``key : value`` line changed (the layout kept)."""
    lines = [line.split(":")[0] + ": " + value if line.strip().startswith(key + " ") else line
             for line in text.splitlines()]
    assert lines != text.splitlines(), key
    return "\n".join(lines)


def test_unrepairable_memory_fails_and_a_pending_repair_asks_for_a_reset(fixture_text):
    text = _with(_with(fixture_text(H100_REAL), "Unrepairable Memory", "Yes"), "TPC Repair Pending", "Yes")
    result = judged(text)["00000000:00:06.0"]
    assert result["gpu.ecc.unrepairable"].severity is Severity.FAIL
    assert "RMA" in result["gpu.ecc.unrepairable"].message
    assert result["gpu.ecc.reset_pending"].severity is Severity.WARN
    assert "channel/TPC repair" in result["gpu.ecc.reset_pending"].message


@pytest.mark.parametrize("action, advice", [
    ("Reset", "nvidia-smi -r"), ("Reboot", "reboot the node"), ("Drain P2P", "peer-to-peer"),
    ("Drain and Reset", "drain its work")])
def test_a_recovery_action_from_the_driver_fails_the_gpu_with_its_advice(fixture_text, action, advice):
    _, (gpu,) = nvidia_smi.parse_query(_with(fixture_text(H100_REAL), "GPU Recovery Action", action))
    (finding,) = nvidia_smi.recovery_findings(gpu)
    assert finding.code == "gpu.recovery_action" and finding.severity is Severity.FAIL
    assert repr(action) in finding.message and advice in finding.message
