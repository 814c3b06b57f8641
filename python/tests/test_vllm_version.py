"""The connector refuses vLLM releases other than the pinned minor one, naming both."""

import pytest

from pegaflow._vllm_version import SUPPORTED_VLLM, check_vllm_version


@pytest.mark.parametrize("version", ["0.33.0", "0.33.2", "0.33.0rc1", "0.33.1+cu130"])
def test_the_pinned_minor_release_is_accepted(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.32.4", "0.34.0", "1.0.0", "dev"])
def test_other_releases_are_refused_with_the_supported_range(version):
    with pytest.raises(ImportError) as e:
        check_vllm_version(version)
    assert f"vllm {version} is installed" in str(e.value)
    assert f"supports vLLM {SUPPORTED_VLLM}.x" in str(e.value) and "vllm==0.33.0" in str(e.value)
