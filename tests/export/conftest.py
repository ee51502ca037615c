"""Fixtures for exports: transformers' copy of remote code goes under the test's own folder, not ~/.cache."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def hf_modules_cache(tmp_path_factory):
    """transformers copies a folder's modeling code into HF_MODULES_CACHE (read once, at import) before running it."""
    import transformers.dynamic_module_utils as dynamic

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf_modules")))
        yield
