"""The devices probe against scripted vendor tools put on PATH: the tools print
the real formats (tests/health/fixtures), with faults in them."""


import pytest

from health.config import DeviceChecks
from health.findings import Severity
from health.probes.devices import probe_devices


def codes(result, severity):
    return {f.code for f in result.findings if f.severity is severity}


@pytest.fixture
def healthy_ascend(scripted_tools, cat):
    def install(ecc_on_3="npu_smi/ecc_950_ok.txt", link_on_4="hccn_tool/link_up.txt"):
        scripted_tools("npu-smi", [
            ('"info"', cat("npu_smi/info_910b_ok.txt")),
            ('"info -t health -i "*', cat("npu_smi/health_ok.txt")),
            ('"info -t ecc -i 3"', cat(ecc_on_3)),
            ('"info -t ecc -i "*', cat("npu_smi/ecc_950_ok.txt")),
        ])
        scripted_tools("hccn_tool", [
            ('"-i 4 -link -g"', cat(link_on_4)),
            ('"-i "*" -link -g"', cat("hccn_tool/link_up.txt")),
            ('"-i "*" -net_health -g"', cat("hccn_tool/net_health_ok.txt")),
        ])
    return install


def test_healthy_ascend_node_passes_with_its_inventory(healthy_ascend, tool_dir):
    healthy_ascend()
    result = probe_devices(DeviceChecks(expected_devices=8), path=str(tool_dir))
    assert codes(result, Severity.FAIL) == set() and codes(result, Severity.WARN) == set()
    assert result.facts["accelerator"] == "npu" and result.facts["device_count"] == 8
    assert result.facts["device_name"] == "910B3" and result.facts["npu_smi"] == "24.1.0"
    assert "roce.link.up" in codes(result, Severity.OK)


def test_double_bit_ecc_on_one_npu_fails_the_node(healthy_ascend, tool_dir):
    healthy_ascend(ecc_on_3="npu_smi/ecc_950_double_bit.txt")
    result = probe_devices(DeviceChecks(), path=str(tool_dir))
    (finding,) = [f for f in result.findings if f.code == "npu.ecc.double_bit"]
    assert finding.severity is Severity.FAIL and finding.evidence["npu"] == 3
    assert "NPU 3" in finding.message


def test_roce_link_down_fails_the_node(healthy_ascend, tool_dir):
    healthy_ascend(link_on_4="hccn_tool/link_down.txt")
    result = probe_devices(DeviceChecks(), path=str(tool_dir))
    (down,) = [f for f in result.findings if f.code == "roce.link.down"]
    assert down.evidence["device"] == 4


def test_fewer_npus_than_expected_fails(healthy_ascend, tool_dir):
    healthy_ascend()
    result = probe_devices(DeviceChecks(expected_devices=16), path=str(tool_dir))
    assert "devices.missing" in codes(result, Severity.FAIL)


def test_a_hung_npu_smi_fails_at_its_timeout_naming_the_command(scripted_tools, tool_dir):
    scripted_tools("npu-smi", [('"info"', "sleep 100000")])  # hangs for good: returning is the timeout
    result = probe_devices(DeviceChecks(tool_timeout_s=0.5), path=str(tool_dir))
    (finding,) = [f for f in result.findings if f.severity is Severity.FAIL]
    assert finding.code == "npu.info.timeout" and "`" in finding.message
    assert "npu-smi info" in finding.evidence["command"]


def test_nvidia_remap_failure_and_xid_79_fail(scripted_tools, tool_dir, cat):
    scripted_tools("nvidia-smi", [('"-q"', cat("nvidia_smi/q_a100_remap_failure.txt"))])
    scripted_tools("dmesg", [('""', cat("xid/dmesg_faults.txt"))])
    result = probe_devices(DeviceChecks(), path=str(tool_dir))
    failing = codes(result, Severity.FAIL)
    assert {"gpu.row_remap.failed", "gpu.ecc.uncorrectable", "gpu.xid.79", "gpu.xid.48"} <= failing
    assert result.facts["nvidia_driver"] == "535.104.05" and result.facts["device_count"] == 2


def test_healthy_nvidia_node_with_clean_kernel_log_passes(scripted_tools, tool_dir, cat):
    scripted_tools("nvidia-smi", [('"-q"', cat("nvidia_smi/q_a100_ok.txt"))])
    scripted_tools("dmesg", [('""', cat("xid/dmesg_clean.txt"))])
    result = probe_devices(DeviceChecks(expected_devices=2), path=str(tool_dir))
    assert [f.code for f in result.findings] == ["gpu.ok"]


def test_a_real_h100_node_passes_with_its_inventory(scripted_tools, tool_dir, cat):
    scripted_tools("nvidia-smi", [('"-q"', cat("nvidia_smi/q_h100_real.txt"))])
    scripted_tools("dmesg", [('""', cat("xid/dmesg_clean.txt"))])
    result = probe_devices(DeviceChecks(expected_devices=1), path=str(tool_dir))
    assert [f.code for f in result.findings] == ["gpu.ok"]
    assert result.facts == {"accelerator": "cuda", "device_count": 1,
                            "device_name": "NVIDIA H100 80GB HBM3", "nvidia_driver": "580.159.04"}


def test_a_recovery_action_asked_by_the_driver_fails_the_node(scripted_tools, tool_dir, fixture_text, tmp_path):
    query = tmp_path / "q.txt"
    query.write_text(fixture_text("nvidia_smi/q_h100_real.txt").replace(
        "GPU Recovery Action                                : None",
        "GPU Recovery Action                                : Reboot"))
    scripted_tools("nvidia-smi", [('"-q"', f"cat '{query}'")])
    scripted_tools("dmesg", [('""', "true")])
    result = probe_devices(DeviceChecks(), path=str(tool_dir))
    assert codes(result, Severity.FAIL) == {"gpu.recovery_action"}
    assert "gpu.ok" not in codes(result, Severity.OK)


def test_a_gpu_fallen_off_the_bus_fails_through_nvidia_smi_itself(scripted_tools, tool_dir, cat):
    scripted_tools("nvidia-smi", [('"-q"', cat("nvidia_smi/lost_gpu.txt") + "; exit 255")])
    scripted_tools("dmesg", [('""', cat("xid/dmesg_clean.txt"))])
    result = probe_devices(DeviceChecks(), path=str(tool_dir))
    assert "gpu.lost" in codes(result, Severity.FAIL)


def test_unreadable_kernel_log_warns(scripted_tools, tool_dir, cat):
    scripted_tools("nvidia-smi", [('"-q"', cat("nvidia_smi/q_a100_ok.txt"))])
    scripted_tools("dmesg", [('""', 'echo "dmesg: read kernel buffer failed: Operation not '
                                    'permitted" >&2; exit 1')])
    result = probe_devices(DeviceChecks(), path=str(tool_dir))
    (finding,) = [f for f in result.findings if f.severity is not Severity.OK]
    assert finding.code == "gpu.xid.unreadable" and "Operation not permitted" in finding.message


def test_cpu_only_node_reports_what_it_has(tool_dir):
    result = probe_devices(DeviceChecks(), path=str(tool_dir))  # an empty PATH: no tools
    assert result.facts["accelerator"] == "cpu" and result.facts["cpu_count"] >= 1
    assert [f.code for f in result.findings] == ["devices.cpu_only"]
    expecting = probe_devices(DeviceChecks(expected_devices=8), path=str(tool_dir))
    assert "devices.missing" in codes(expecting, Severity.FAIL)
