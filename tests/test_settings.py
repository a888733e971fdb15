"""Every setting validated: environment variables, the OPREGISTRY_CONFIG file, backend choices.

A value that is wrong on its face (a boolean that is not one, a malformed
file, an unknown dispatch key) is a :class:`~opregistry.ConfigError` naming
the variable or the file: one line, exit status 2 in the CLI.  What is only
wrong against what is installed (a name in a list that is not installed, a
variable nobody reads) is a problem of the plan: ``doctor`` reports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import opregistry
from opregistry import ConfigError
from opregistry.config import Policy, Settings, autoload_enabled, parse_flag

from .conftest import BACKENDS, op_dist, plan

ACCEPTED = "use 1/0, true/false, yes/no or on/off"


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " On "])
def test_true_values(value):
    assert parse_flag(value, False, "OPREGISTRY_STRICT") is True
    assert Settings.from_env({"OPREGISTRY_STRICT": value}).strict is True


@pytest.mark.parametrize("value", ["0", "false", "No", "off", "", "  "])
def test_false_or_default_values(value):
    assert Settings.from_env({"OPREGISTRY_STRICT": value}).strict is False
    assert autoload_enabled({"OPREGISTRY_AUTOLOAD": value}) is (not value.strip() or False)


@pytest.mark.parametrize("variable", ["OPREGISTRY_STRICT", "OPREGISTRY_AUTOLOAD"])
@pytest.mark.parametrize("value", ["ture", "garbage", "2", "enable"])
def test_invalid_boolean_names_the_variable_and_the_accepted_values(variable, value):
    with pytest.raises(ConfigError) as info:
        Settings.from_env({variable: value})
    assert str(info.value) == f"{variable}={value!r} is not a boolean: {ACCEPTED}"
    if variable == "OPREGISTRY_AUTOLOAD":
        with pytest.raises(ConfigError, match=variable):
            autoload_enabled({variable: value})


def test_backend_choice_from_environment_and_file(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('backends = {CPU = "My_CPU", cuda = "x-cuda"}\n')
    settings = Settings.from_env({"OPREGISTRY_CONFIG": str(config),
                                  "OPREGISTRY_BACKEND_CUDA": "opregistry-cuda",
                                  "OPREGISTRY_BACKEND_PRIVATEUSE1": "npu-backend"})
    policy = settings.policy
    assert policy.backend_for("CPU") == "my-cpu"
    assert policy.backend_for("CUDA") == "opregistry-cuda", "the variable wins over the file"
    assert policy.backend_for("PrivateUse1") == "npu-backend"
    assert policy.backend_source("CUDA") == "OPREGISTRY_BACKEND_CUDA"
    assert policy.backend_source("CPU") == f"OPREGISTRY_CONFIG={config} (backends.CPU)"
    assert Policy(backends={"cpu": "A"}) == Policy(backends={"CPU": "a"})


@pytest.mark.parametrize(("env", "message"), [
    ({"OPREGISTRY_BACKEND_CPX": "x"}, "OPREGISTRY_BACKEND_CPX: 'CPX' is not a dispatch key; "
                                      "did you mean 'CPU'?"),
    ({"OPREGISTRY_BACKEND_CPU": "a,b"}, "OPREGISTRY_BACKEND_CPU='a,b': name one distribution"),
])
def test_invalid_backend_choice(env, message):
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ('backends = ["CPU"]\n', "backends must be a table"),
    ('backends = {GPU = "x"}\n', "backends: 'GPU' is not a dispatch key"),
    ('backends = {CPU = 1}\n', "backends must be a table"),
    ("strict = \"yes\"\n", "strict must be true or false"),
    (b"\xff\xfe".decode("latin-1") + "x = 1\n", "not a UTF-8 text file"),
])
def test_bad_config_file_values(tmp_path, text, message):
    config = tmp_path / "c.toml"
    config.write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env({"OPREGISTRY_CONFIG": str(config)})
    assert str(config) in str(info.value)
    assert "\n" not in str(info.value).strip() or "TOML" in str(info.value)


# -- checked against what is installed -------------------------------------------------


def test_allow_list_naming_a_missing_distribution_is_an_error_with_did_you_mean(dists, ns,
                                                                               monkeypatch):
    good = op_dist(dists, "goodlib", ns, "lib.define('f(Tensor x) -> Tensor')\n")
    monkeypatch.setenv("OPREGISTRY_PLUGINS", f"{good[:-1]},opregistry-cpu")  # a typo
    resolved = opregistry.plan()
    [problem] = [p for p in resolved.errors if p.code == "config-unknown-distribution"]
    assert problem.message == (f"OPREGISTRY_PLUGINS names {good[:-1]!r}, which is not an "
                               f"installed distribution with opregistry plugins; did you mean "
                               f"{good!r}?")
    assert problem.culprits == (), "nothing is left out for it"
    with pytest.raises(opregistry.ResolutionError, match="config-unknown-distribution"):
        opregistry.load(strict=True, reload=True)


def test_block_list_and_arguments_are_checked_too(dists, ns):
    op_dist(dists, "goodlib", ns, "lib.define('f(Tensor x) -> Tensor')\n")
    resolved = plan(dists, block=["goodlibb"], plugins=[*BACKENDS, *dists.names, "nope-pkg"])
    messages = sorted(p.message for p in resolved.errors if p.code == "config-unknown-distribution")
    assert len(messages) == 2
    assert messages[0].startswith("the block argument names 'goodlibb'")
    assert "did you mean 'goodlib'?" in messages[0]
    assert messages[1].startswith("the plugins argument names 'nope-pkg'")


def test_unknown_opregistry_variable_is_a_warning_with_did_you_mean(dists, ns, monkeypatch):
    monkeypatch.setenv("OPREGISTRY_STICT", "1")
    resolved = plan(dists)
    [problem] = [p for p in resolved.problems if p.code == "config-unknown-variable"]
    assert problem.severity == "warning"
    assert problem.message == ("OPREGISTRY_STICT is set but opregistry reads no such variable; "
                               "did you mean 'OPREGISTRY_STRICT'?")


# -- the CLI: exit status 2, one line, no traceback ----------------------------------


@pytest.mark.parametrize(("setup", "expected"), [
    ("missing", "OPREGISTRY_CONFIG={path}: cannot read the file (No such file or directory); "
                "fix the path or unset OPREGISTRY_CONFIG"),
    ("malformed", "OPREGISTRY_CONFIG={path}: not valid TOML: "),
    ("strict", "OPREGISTRY_STRICT='ture' is not a boolean: " + ACCEPTED),
])
def test_cli_configuration_error_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, setup,
                                                        expected):
    from opregistry.cli import main

    path = tmp_path / "opregistry.toml"
    if setup == "malformed":
        path.write_text("plugins = [\n")
    if setup == "strict":
        monkeypatch.setenv("OPREGISTRY_STRICT", "ture")
    else:
        monkeypatch.setenv("OPREGISTRY_CONFIG", str(path))
    expected = expected.format(path=path)
    for command in (["list"], ["lock", "--force"], ["verify"]):
        assert main(command) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        [line] = captured.err.splitlines()
        assert line.startswith("opregistry: " + expected), line
    # doctor diagnoses: the configuration error is its (one) error problem
    assert main(["doctor", "--json"]) == 1
    [finding] = json.loads(capsys.readouterr().out)["problems"]
    assert finding["code"] == "config-invalid" and finding["message"].startswith(expected)
    assert main(["doctor"]) == 1
    captured = capsys.readouterr()
    assert f"ERROR   [config-invalid] {expected}" in captured.out and not captured.err


def test_cli_configuration_error_in_a_real_process(tmp_path):
    """The installed `opregistry` command: status 2, one line on stderr, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["OPREGISTRY_CONFIG"] = str(tmp_path / "nope.toml")
    out = subprocess.run([sys.executable, "-m", "opregistry", "list"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_doctor_reports_a_misspelt_allow_list(dists, ns, monkeypatch, capsys):
    """Before: "No problems found", exit 0, and nothing loaded."""
    from opregistry.cli import main

    good = op_dist(dists, "goodlib", ns, "lib.define('f(Tensor x) -> Tensor')\n")
    monkeypatch.setenv("OPREGISTRY_PLUGINS", good + "x")
    assert main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [finding] = [f for f in report["problems"] if f["code"] == "config-unknown-distribution"]
    assert finding["severity"] == "error" and f"did you mean {good!r}" in finding["message"]
