from health.findings import Severity
from health.parsers import npu_smi


def by_code(findings):
    return {f.code: f for f in findings}


def test_910b_table_lists_every_chip_with_bus_health_and_hbm(fixture_text):
    inventory = npu_smi.parse_info(fixture_text("npu_smi/info_910b_ok.txt"))
    assert inventory.version == "24.1.0"
    assert inventory.npu_ids == list(range(8))
    assert len(inventory.chips) == 8  # the process table below is not read as devices
    second = inventory.chips[1]
    assert (second.bus_id, second.health, second.phy_id) == ("0000:C2:00.0", "OK", None)
    assert (second.hbm_used_mb, second.hbm_total_mb) == (58626, 65536)  # "58626/ 65536"
    assert second.power_w == 96.1 and second.aicore_pct == 87
    assert [f.severity for f in npu_smi.info_findings(inventory)] == [Severity.OK]


def test_a3_table_has_two_chips_per_npu_with_phy_ids(fixture_text):
    inventory = npu_smi.parse_info(fixture_text("npu_smi/info_a3_ok.txt"))
    assert len(inventory.chips) == 16 and inventory.npu_ids == list(range(8))
    last = inventory.chips[-1]
    assert (last.npu_id, last.chip_id, last.phy_id, last.bus_id) == (7, 1, 15, "0000:83:00.0")
    assert last.power_w is None  # the second chip prints "-" for power


def test_a_row_in_alarm_excludes_and_warning_warns(fixture_text):
    findings = npu_smi.info_findings(
        npu_smi.parse_info(fixture_text("npu_smi/info_910b_faulty.txt")))
    codes = by_code(findings)
    assert codes["npu.health.alarm"].severity is Severity.FAIL
    assert "NPU 5" in codes["npu.health.alarm"].message
    assert "npu-smi info -t health -i 5" in codes["npu.health.alarm"].message
    assert codes["npu.health.warning"].severity is Severity.WARN
    assert codes["npu.health.warning"].evidence["npu"] == 2


def test_a3_critical_and_unknown_chips_fail(fixture_text):
    findings = npu_smi.info_findings(npu_smi.parse_info(fixture_text("npu_smi/info_a3_faulty.txt")))
    failing = {(f.evidence["npu"], f.evidence["chip"]): f.code for f in findings
               if f.severity is Severity.FAIL}
    assert failing == {(3, 1): "npu.health.critical", (6, 0): "npu.health.unknown"}


def test_health_detail_carries_error_codes_and_every_information_line(fixture_text):
    (detail,) = npu_smi.parse_health(fixture_text("npu_smi/health_alarm.txt"))
    assert detail.npu_id == 5 and detail.health == "Alarm"
    assert detail.error_codes == ("80E01801", "80CB8009")
    assert len(detail.error_info) == 2 and "uncorrectable ECC" in detail.error_info[0]
    (finding,) = npu_smi.health_findings([detail], 5)
    assert finding.severity is Severity.FAIL
    assert "80E01801 80CB8009" in finding.message and "task timeout" in finding.message


def test_health_detail_ok_and_chip_variant(fixture_text):
    healthy = npu_smi.parse_health(fixture_text("npu_smi/health_ok.txt"))
    assert npu_smi.health_findings(healthy, 0) == []
    (detail,) = npu_smi.parse_health(fixture_text("npu_smi/health_chip_warning.txt"))
    assert (detail.health, detail.chip, detail.error_codes) == ("Warning", "0", ("80818C03",))
    assert npu_smi.health_findings([detail], 2)[0].severity is Severity.WARN


def judge(text, correctable_warn=10000):
    ecc = npu_smi.parse_ecc(text)
    return by_code(npu_smi.ecc_findings(ecc, 0, correctable_warn, 0))


def test_double_bit_ecc_fails_and_names_pages_waiting_for_isolation(fixture_text):
    codes = judge(fixture_text("npu_smi/ecc_950_double_bit.txt"))
    assert codes["npu.ecc.double_bit"].severity is Severity.FAIL
    assert codes["npu.ecc.double_bit"].evidence["count"] == 2
    assert "drain the node" in codes["npu.ecc.double_bit"].message
    assert codes["npu.ecc.pages_pending"].severity is Severity.WARN
    assert "npu.ecc.double_bit_lifetime" not in codes  # said once, by the failure


def test_clean_ecc_layouts_give_no_findings(fixture_text):
    assert judge(fixture_text("npu_smi/ecc_950_ok.txt")) == {}
    ecc = npu_smi.parse_ecc(fixture_text("npu_smi/ecc_910b_ok.txt"))
    assert ecc.npu_id == 3
    assert ecc.counts["ddr double bit error count"] == 0  # DDR and HBM both read
    assert ecc.counts["hbm single bit aggregate total err cnt"] == 5
    assert judge(fixture_text("npu_smi/ecc_910b_ok.txt")) == {}


def test_single_bit_storm_warns_above_threshold_only(fixture_text):
    text = fixture_text("npu_smi/ecc_910b_single_bit_storm.txt")
    assert judge(text)["npu.ecc.single_bit_high"].severity is Severity.WARN
    assert judge(text, correctable_warn=50000) == {}


def test_200i_a2_hyphenated_double_bit_counter_fails(fixture_text):
    codes = judge(fixture_text("npu_smi/ecc_200i_a2_double_bit.txt"))
    assert codes["npu.ecc.double_bit"].severity is Severity.FAIL
