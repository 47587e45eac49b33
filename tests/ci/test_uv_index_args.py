"""`make setup` installs with uv from where pip is configured to install from
(.ci/uv_index_args.py): the same mirror, wheel folder and constraints, by pip's own precedence;
a setting uv cannot honour is refused, never dropped."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "uv_index_args.py"


@pytest.fixture(scope="module")
def uv_args():
    spec = importlib.util.spec_from_file_location("uv_index_args", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# `pip config list` as CI's machine prints it.
CI_LISTING = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_ci_s_pip_configuration_becomes_the_same_places_for_uv(uv_args):
    words = uv_args.uv_arguments(uv_args.effective_settings(CI_LISTING))
    assert words == ["--constraint", "/etc/xdg/pip/constraints.txt",
                     "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
                     "--find-links", "/opt/wheels"]


def test_the_environment_wins_over_the_install_section_over_global(uv_args):
    listing = ("global.index-url='https://mirror.a/simple'\ninstall.index-url='https://mirror.b/simple'\n"
               ":env:.index-url='https://mirror.c/simple'\nglobal.no-index='false'\ninstall.pre='yes'\n")
    assert uv_args.uv_arguments(uv_args.effective_settings(listing)) == [
        "--index-url", "https://mirror.c/simple", "--prerelease=allow"]


def test_no_pip_configuration_leaves_uv_on_its_default_index(uv_args):
    assert uv_args.uv_arguments(uv_args.effective_settings("")) == []


def test_a_setting_uv_cannot_take_is_refused_in_one_line(uv_args):
    with pytest.raises(ValueError, match="'only-binary'.*INSTALLER=pip"):
        uv_args.uv_arguments(uv_args.effective_settings("global.only-binary=':all:'\n"))
