import pytest


@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    """(site dir with tilebake-ascend installed, its kernel dir, the stand-in libascendcl): see
    harness.build_site. One build a session: it lowers every Ascend variant."""
    pytest.importorskip("tilelang")  # the stage-1 lowering (a build-time dependency; the CI venv has it)
    from tests.ascend.harness import build_site

    return build_site(tmp_path_factory.mktemp("ascend"))
