from health.findings import Severity
from health.parsers import hccn_tool


def test_link_up_is_ok_and_down_fails_with_a_hint(fixture_text):
    up = hccn_tool.parse_link(fixture_text("hccn_tool/link_up.txt"))
    assert up == "UP"
    assert hccn_tool.link_findings(0, up)[0].severity is Severity.OK
    down = hccn_tool.parse_link(fixture_text("hccn_tool/link_down.txt"))
    (finding,) = hccn_tool.link_findings(4, down)
    assert finding.severity is Severity.FAIL and finding.code == "roce.link.down"
    assert "device 4 is DOWN" in finding.message and "-link_stat" in finding.message


def test_net_health_states_map_to_verdicts(fixture_text):
    ok = hccn_tool.parse_net_health(fixture_text("hccn_tool/net_health_ok.txt"))
    assert hccn_tool.net_health_findings(1, ok)[0].severity is Severity.OK
    timeout = hccn_tool.parse_net_health(fixture_text("hccn_tool/net_health_timeout.txt"))
    assert timeout == "Receive timeout"
    (finding,) = hccn_tool.net_health_findings(1, timeout)
    assert finding.severity is Severity.FAIL and "did not answer" in finding.message
    unset = hccn_tool.parse_net_health(fixture_text("hccn_tool/net_health_unset.txt"))
    (finding,) = hccn_tool.net_health_findings(1, unset)
    assert finding.severity is Severity.WARN and "-netdetect" in finding.message


def test_answers_without_a_status_are_warned_not_trusted():
    assert hccn_tool.parse_link("hccn_tool: device 9 not found\n") is None
    assert hccn_tool.link_findings(9, None)[0].severity is Severity.WARN
    assert hccn_tool.net_health_findings(9, None)[0].severity is Severity.WARN
