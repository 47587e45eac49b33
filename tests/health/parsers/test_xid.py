import pytest

from health.findings import Severity
from health.parsers import xid


@pytest.fixture
def findings(fixture_text):
    return {f.evidence["xid"]: f for f in xid.xid_findings(
        xid.parse_xid(fixture_text("xid/dmesg_faults.txt")))}


def test_every_line_format_is_read(fixture_text):
    events = xid.parse_xid(fixture_text("xid/dmesg_faults.txt"))
    assert [e.code for e in events] == [48, 63, 64, 74, 79, 94, 94, 95, 13, 999]
    by_code = {e.code: e for e in events}
    assert by_code[79].pci == "0000:2b:00" and by_code[79].pid is None  # journald, no pid
    assert by_code[74].pid == "<unknown>" and by_code[74].message.startswith("NVLink")
    assert by_code[13].pci == "0000:81:00"  # older driver: no "PCI:" prefix
    assert by_code[48].process == "python3"


@pytest.mark.parametrize("code, severity, words", [
    (48, Severity.FAIL, "double-bit"),
    (63, Severity.WARN, "reset the GPU"),
    (64, Severity.FAIL, "FAILED"),
    (74, Severity.FAIL, "NVLink"),
    (79, Severity.FAIL, "fallen off the bus"),
    (94, Severity.WARN, "contained ECC"),
    (95, Severity.FAIL, "uncontained ECC"),
    (999, Severity.WARN, "does not know"),
])
def test_each_xid_maps_to_a_verdict_and_a_reason(findings, code, severity, words):
    assert findings[code].severity is severity
    assert words in findings[code].message


def test_repeats_are_counted_once_per_gpu(findings):
    assert findings[94].evidence["count"] == 2 and "(2 times)" in findings[94].message


def test_a_clean_log_has_no_xid(fixture_text):
    assert xid.parse_xid(fixture_text("xid/dmesg_clean.txt")) == []
