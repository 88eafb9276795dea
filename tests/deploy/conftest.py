"""Every deploy test keeps the measured decisions (``--backend auto``, ``--precision auto``) in its own
folder, never in the user's ``~/.cache/ppdlx_deploy``: a decision cached by one test (or by a user) must
not answer another's question."""
import pytest


@pytest.fixture(autouse=True)
def own_decision_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PPDLX_DEPLOY_CACHE", str(tmp_path_factory.mktemp("ppdlx_deploy_cache")))
