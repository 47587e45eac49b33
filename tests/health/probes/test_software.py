import platform

import torch

from health.probes.software import (collect_versions, parse_nvidia_driver, probe_software)


def test_versions_come_from_installed_metadata(tmp_path):
    versions = collect_versions(ascend_root=str(tmp_path), nvidia_version_file=str(tmp_path / "x"))
    assert versions["python"] == platform.python_version()
    # The public version: a CUDA build's metadata may or may not carry the
    # local tag (+cu130) that torch.__version__ shows.
    assert versions["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert versions["runmgr"] and versions["ray"]
    assert versions["cann"] is None and versions["driver"] is None


def test_cann_and_ascend_driver_versions_are_read_from_their_install_files(tmp_path):
    toolkit = tmp_path / "ascend-toolkit" / "latest" / "aarch64-linux"
    toolkit.mkdir(parents=True)
    (toolkit / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.0.RC2\ninnerversion=V100R001C18\n"
        "arch=aarch64\nos=linux\npath=/usr/local/Ascend/ascend-toolkit/8.0.RC2/aarch64-linux\n")
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "version.info").write_text(
        "Version=24.1.rc2\nascendhal_version=7.35.23\naicpu_version=1.0\n")
    result = probe_software(ascend_root=str(tmp_path))
    assert result.facts["software.cann"] == "8.0.RC2"
    assert result.facts["software.driver"] == "24.1.rc2"
    assert "cann 8.0.RC2" in result.findings[0].message


def test_nvidia_driver_version_both_module_flavours():
    assert parse_nvidia_driver("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  "
                               "Sat Aug 19 01:15:15 UTC 2023\n") == "535.104.05"
    open_module = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  "
                   "Release Build  (dvs-builder@U16-I3-B03-4-3)\n")
    assert parse_nvidia_driver(open_module) == "550.54.14"
