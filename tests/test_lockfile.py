"""Lock data, fingerprint, diff and verify_lock: real entry points, no torch needed."""

from __future__ import annotations

import json
import subprocess
import sys

import attrs
import pytest

import opregistry
from opregistry import LockMismatchError
from opregistry.model import Declarations
from opregistry.registry import verify_lock
from opregistry.lockfile import (
    diff_lock,
    fingerprint,
    fingerprint_of,
    lock_data,
    read_lock,
    write_lock,
)
from opregistry.model import Backend, Kernel, Namespace, OpDef, Origin
from opregistry.resolver import resolve

from .conftest import op_dist, plan


def declarations(reverse: bool) -> Declarations:
    a = Origin("dist-a", "1.0", "opregistry.ops", "ops", "a:lib")
    b = Origin("dist-b", "2.0", "opregistry.ops", "ops", "b:lib")
    cpu = Origin("opregistry-cpu", "0.1.0", "opregistry.backends", "cpu", "c:plugin")
    items = {
        "namespaces": [Namespace(name="nsa", origin=a), Namespace(name="nsa", kind="FRAGMENT", origin=b)],
        "ops": [OpDef(namespace="nsa", name="f", schema="(Tensor x) -> Tensor", origin=a),
                OpDef(namespace="nsa", name="g", schema="(Tensor x) -> Tensor", origin=b)],
        "kernels": [Kernel(op="nsa::f", key="cpu", fn="a.k:f", origin=a),
                    Kernel(op="nsa::g", key="cpu", fn="b.k:g", origin=b),
                    Kernel(op="nsa::g", key="fake", fn="b.k:g_fake", origin=b)],
        "backends": [Backend(name="cpu", keys=("CPU",), device_type="cpu", origin=cpu)],
        "distributions": [a, b, cpu],
    }
    if reverse:
        items = {k: list(reversed(v)) for k, v in items.items()}
    return Declarations(**items)


def test_fingerprint_does_not_depend_on_entry_point_order():
    """The same declarations found in the opposite order give the same lock and fingerprint."""
    forward, backward = resolve(declarations(False)), resolve(declarations(True))
    assert lock_data(forward) == lock_data(backward)
    assert fingerprint(forward) == fingerprint(backward)
    assert fingerprint(forward).startswith("sha256:") and len(fingerprint(forward)) == 71


def test_fingerprint_changes_with_any_locked_fact():
    """A version, a schema or a kernel origin each change the fingerprint."""
    decl = declarations(False)
    base = fingerprint(resolve(decl))
    newer = Origin("dist-b", "2.1", "opregistry.ops", "ops", "b:lib")
    changed = [
        attrs.evolve(decl, distributions=(*decl.distributions[:1], newer, decl.distributions[2])),
        attrs.evolve(decl, ops=(decl.ops[0], attrs.evolve(decl.ops[1], schema="(Tensor y) -> Tensor"))),
        attrs.evolve(decl, kernels=(attrs.evolve(decl.kernels[0], fn="a.k:f2"), *decl.kernels[1:])),
    ]
    prints = {fingerprint(resolve(d)) for d in changed}
    assert base not in prints and len(prints) == 3


def test_lock_data_records_origins_and_status(dists, ns):
    """Schemas, owners, kernels with origin and status; no machine-specific paths."""
    d = op_dist(dists, "lock-a", ns,
                     "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f', 'cuda': 'k:f'},"
                     " fake='k:fake', tags=['pt2_compliant_tag'])\n")
    data = lock_data(plan(dists))
    assert data["distributions"][d] == "1.0"
    assert data["namespaces"][ns] == {"owner": d, "fragments": [], "closed": False}
    op = data["ops"][f"{ns}::f"]
    assert op["schema"] == "f(Tensor x) -> Tensor" and op["tags"] == ["pt2_compliant_tag"]
    assert op["kernels"]["CPU"] == {"kind": "device", "kernel": "k:f", "setup_context": None,
                                    "distribution": d,
                                    "status": "active", "override": False}
    # CUDA is installed but this machine may lack a GPU: the lock says "active" either way
    assert op["kernels"]["CUDA"]["status"] == "active"
    assert "/" not in json.dumps(data["ops"])  # no source paths


def test_write_then_verify_roundtrip(dists, ns, tmp_path):
    """verify_lock returns the fingerprint written in the lockfile when nothing changed."""
    op_dist(dists, "lock-b", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'})\n")
    resolved = plan(dists)
    path = tmp_path / "opregistry.lock"
    written = write_lock(resolved, path)
    assert read_lock(path) == written
    assert written["fingerprint"] == fingerprint(resolved) == fingerprint_of(written)
    assert verify_lock(path, plan=plan(dists)) == written["fingerprint"]


def test_verify_explains_every_difference(dists, ns, tmp_path):
    """Missing distribution, other version, other schema and other kernel origin, all at once."""
    a = op_dist(dists, "lock-c", ns,
                     "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'})\n")
    b = op_dist(dists, "lock-d", f"{ns}d",
                     "lib.define('g(Tensor x) -> Tensor', kernels={'cpu': 'k:g'})\n")
    path = tmp_path / "opregistry.lock"
    data = write_lock(plan(dists), path)
    # the lockfile of "another machine": other version of a, other schema and kernel of f
    data["distributions"][a] = "0.9"
    data["ops"][f"{ns}::f"]["schema"] = "f(Tensor x, int n) -> Tensor"
    data["ops"][f"{ns}::f"]["kernels"]["CPU"]["kernel"] = "k:f_old"
    data["fingerprint"] = fingerprint_of(data)
    path.write_text(json.dumps(data))
    here = plan(dists, plugins=["opregistry-cpu", a])  # b is not installed "here"
    with pytest.raises(LockMismatchError) as info:
        verify_lock(path, plan=here)
    diffs = info.value.differences
    text = str(info.value)
    assert f"distribution {a}: other version: the lockfile has 0.9, this environment has 1.0" in diffs
    assert f"distribution {b}==1.0: in the lockfile, missing from this environment" in diffs
    assert any(f"op {ns}::f: other schema" in d and "int n" in d for d in diffs)
    assert any(f"op {ns}::f CPU kernel: other origin" in d and "k:f_old" in d for d in diffs)
    assert any(f"op {ns}d::g (from {b}==1.0): in the lockfile, missing" in d for d in diffs)
    assert all(d in text for d in diffs) and "opregistry lock -o" in text


def test_other_torch_is_a_difference(dists, ns, tmp_path):
    """The lock records torch's version (from its metadata); another one fails verify."""
    import importlib_metadata

    op_dist(dists, "lock-t", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'})\n")
    installed = importlib_metadata.version("torch").partition("+")[0]
    path = tmp_path / "opregistry.lock"
    data = write_lock(plan(dists), path)
    assert data["torch"] == installed
    # the lock of a node with an older torch, re-fingerprinted as `opregistry lock` would
    other = "2.11.0" if installed != "2.11.0" else "2.12.0"
    data["torch"] = other
    data["fingerprint"] = fingerprint_of(data)
    path.write_text(json.dumps(data))
    assert data["fingerprint"] != fingerprint(plan(dists))
    with pytest.raises(LockMismatchError) as info:
        verify_lock(path, plan=plan(dists))
    assert list(info.value.differences) == [
        f"torch: other version: the lockfile has {other}, this environment has {installed}"]
    # verify_consistent shares diff_lock: the same sentence, with ranks
    assert diff_lock(data, lock_data(plan(dists)), old_label="rank 0", new_label="rank 1") == [
        f"torch: other version: rank 0 has {other}, rank 1 has {installed}"]


def test_torch_build_label_is_not_locked(dists, ns, tmp_path, monkeypatch):
    """A lock made with torch 2.13.0+cpu verifies where torch is 2.13.0+cu128 (a GPU node)."""
    import importlib_metadata

    op_dist(dists, "lock-u", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'})\n")
    real = importlib_metadata.version
    monkeypatch.setattr(importlib_metadata, "version",
                        lambda name: "2.13.0+cpu" if name == "torch" else real(name))
    path = tmp_path / "opregistry.lock"
    written = write_lock(plan(dists), path)
    assert written["torch"] == "2.13.0"
    monkeypatch.setattr(importlib_metadata, "version",
                        lambda name: "2.13.0+cu128" if name == "torch" else real(name))
    assert verify_lock(path, plan=plan(dists)) == written["fingerprint"]
    monkeypatch.setattr(importlib_metadata, "version",
                        lambda name: "2.14.0.dev20261101+cu128" if name == "torch" else real(name))
    with pytest.raises(LockMismatchError, match="torch: other version: the lockfile has 2.13.0, "
                                                "this environment has 2.14.0.dev20261101"):
        verify_lock(path, plan=plan(dists))


def test_diff_names_kernel_added_on_one_side(dists, ns):
    """A kernel present on one side only (e.g. one more backend) is reported with its origin."""
    d = op_dist(dists, "lock-e", ns,
                     "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'}, vmap='k:vf')\n")
    with_vmap = lock_data(plan(dists))
    without = lock_data(plan(dists, block=["opregistry-vmap"]))
    diffs = diff_lock(with_vmap, without, old_label="rank 0", new_label="rank 1")
    assert "distribution opregistry-vmap==0.1.0: in rank 0, missing from rank 1" in diffs
    assert any("FuncTorchBatched kernel" in x and "status: rank 0 has 'active', rank 1 has "
               "'inactive'" in x and d in x for x in diffs)
    assert diff_lock(with_vmap, with_vmap) == []


def test_edited_lockfile_is_detected(dists, ns, tmp_path):
    """A hand-edited fingerprint is a difference even when the content matches."""
    op_dist(dists, "lock-f", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'})\n")
    path = tmp_path / "opregistry.lock"
    data = write_lock(plan(dists), path)
    data["fingerprint"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(data))
    with pytest.raises(LockMismatchError, match="edited by hand"):
        verify_lock(path, plan=plan(dists))


@pytest.mark.parametrize("content, match", [
    (None, "does not exist; create it with 'opregistry lock -o"),
    ("{not json", "is not valid JSON"),
    ('{"lock_version": 99}', "has lock_version 99"),
])
def test_bad_lockfile_says_what_to_do(tmp_path, content, match):
    path = tmp_path / "opregistry.lock"
    if content is not None:
        path.write_text(content)
    with pytest.raises(LockMismatchError, match=match):
        read_lock(path)


def test_verify_lock_is_public_and_does_not_import_torch(tmp_path):
    """opregistry.verify_lock at program start: plan only, torch stays unimported."""
    path = tmp_path / "opregistry.lock"
    code = (
        "import sys, opregistry\n"
        "from opregistry.lockfile import write_lock\n"
        f"write_lock(opregistry.plan(), {str(path)!r})\n"
        f"print(opregistry.verify_lock({str(path)!r}))\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == json.loads(path.read_text())["fingerprint"]
    assert opregistry.verify_lock is verify_lock


def test_allowed_override_is_locked_and_diffed(dists, ns):
    """An override allowed by policy: the winner and the overridden kernel are both in the lock."""
    import opregistry

    owner = op_dist(dists, "lock-owner", ns,
                         "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'k:f'})\n")
    patch = op_dist(dists, "lock-patch", ns, f"lib.impl('{ns}::f', 'cpu', 'p:f', override=True)\n",
                         kind="IMPL")
    allowed = lock_data(plan(dists, policy=opregistry.Policy(allow_override={ns})))
    kernels = allowed["ops"][f"{ns}::f"]["kernels"]
    assert kernels["CPU"]["kernel"] == "p:f" and kernels["CPU"]["distribution"] == patch
    assert [e["distribution"] for e in kernels["CPU (overridden)"]] == [owner]
    without_patch = lock_data(plan(dists, plugins=["opregistry-cpu", owner]))
    diffs = diff_lock(allowed, without_patch)
    assert (f"op {ns}::f CPU (overridden): the lockfile has k:f from {owner}==1.0, "
            f"this environment has none") in diffs
    assert any(f"op {ns}::f CPU kernel: other origin: the lockfile has p:f from {patch}==1.0, "
               f"this environment has k:f from {owner}==1.0" in d for d in diffs)
