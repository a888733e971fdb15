"""Discovery: both entry-point groups, allow/block lists from the environment, strict mode."""

from __future__ import annotations

import pytest

from opregistry import ResolutionError
from opregistry.config import Settings
from opregistry.discovery import BACKENDS_GROUP, OPS_GROUP, discover

from .conftest import BACKENDS

GOOD = """
from opregistry import OpLibrary
lib = OpLibrary(NS)
lib.define("f(Tensor x) -> Tensor")
"""


def _good(dists, name, ns):
    return dists.module_dist(name, ns, GOOD)[0]


def test_finds_both_groups_with_origins(dists, ns):
    """Installed backends and a temporary op distribution are found, each with its origin."""
    name = _good(dists, "Some_Pkg", ns)
    found = discover(Settings(allow=[*BACKENDS, name]))
    by_dist = {p.origin.distribution: p.origin for p in found.plugins}
    assert name == "some-pkg" and by_dist["some-pkg"].group == OPS_GROUP
    assert by_dist["some-pkg"].version == "1.0"
    assert by_dist["some-pkg"].entry_point_spec == f"ops = Some_Pkg_{ns}:lib"
    assert by_dist["opregistry-cpu"].group == BACKENDS_GROUP
    assert str(by_dist["some-pkg"]).startswith("some-pkg==1.0 (entry point 'ops = ")


def test_allow_list_from_environment(dists, ns, monkeypatch):
    a = _good(dists, "pkg-a", ns)
    _good(dists, "pkg-b", f"{ns}b")
    monkeypatch.setenv("OPREGISTRY_PLUGINS", f" PKG_A , {BACKENDS[0]}")  # pip-style names
    found = discover(Settings.from_env())
    assert {p.origin.distribution for p in found.plugins} == {a, BACKENDS[0]}
    reasons = {s.origin.distribution: s.reason for s in found.skipped}
    assert reasons["pkg-b"] == "not in OPREGISTRY_PLUGINS"


def test_empty_allow_list_loads_nothing(dists, ns, monkeypatch):
    _good(dists, "pkg-a", ns)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", "")
    found = discover(Settings.from_env())
    assert found.plugins == ()
    assert any(s.origin.distribution == "pkg-a" for s in found.skipped)


def test_block_list_wins_over_allow_list(dists, ns, monkeypatch):
    a = _good(dists, "pkg-a", ns)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", a)
    monkeypatch.setenv("OPREGISTRY_BLOCK", "pkg-a")
    found = discover(Settings.from_env())
    assert found.plugins == ()
    assert [s.reason for s in found.skipped if s.origin.distribution == a] == [
        "blocked by OPREGISTRY_BLOCK"]


def test_strict_from_environment_raises_on_a_broken_plugin(dists, ns, monkeypatch):
    """OPREGISTRY_STRICT=1 turns a plugin that fails to import into an exception."""
    import opregistry

    dists.make("ghost", ops={"ops": "no_such_module_for_strict:lib"})
    monkeypatch.setenv("OPREGISTRY_STRICT", "1")
    with pytest.raises(ResolutionError, match=r"ghost==1\.0 .*no_such_module_for_strict") as info:
        opregistry.load(reload=True, plugins=[*BACKENDS, "ghost"])
    assert info.value.distribution == "ghost==1.0"
    assert info.value.entry_point == "ops = no_such_module_for_strict:lib"
    assert opregistry.get_registry() is None


def test_metadata_header_reader_agrees_with_the_email_parser(tmp_path):
    """Discovery's two-header reader gives importlib-metadata's Name and Version, or defers."""
    import importlib_metadata

    from opregistry.discovery import _headers, _name_version

    read = 0
    for dist in importlib_metadata.distributions():
        fast = _headers(dist)
        if fast is not None:
            read += 1
            assert fast == (dist.metadata["Name"], dist.metadata["Version"]), dist
    assert read > 10  # the repository's own distributions at least take the fast path
    # a folded header, a repeated one and an egg-info PKG-INFO: the answer is still the parser's
    cases = {
        "folded-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: folded\n  more\nVersion: 1.0\n",
        "twice-1.0.dist-info/METADATA": "Name: twice\nname: other\nVersion:  1.0 \n\nName: body\n",
        "legacy.egg-info/PKG-INFO": "Metadata-Version: 1.0\nName: legacy\nVersion: 2\n",
    }
    for rel, text in cases.items():
        path = tmp_path / rel
        path.parent.mkdir()
        path.write_text(text)
        dist = importlib_metadata.PathDistribution(path.parent)
        assert _name_version(dist, None) == (dist.metadata["Name"], dist.metadata["Version"])
    assert _headers(importlib_metadata.PathDistribution(tmp_path / "folded-1.0.dist-info")) is None
