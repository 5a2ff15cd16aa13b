"""The two GitHub Actions workflows, run as a runner runs them, offline.

curvcal's release job (.github/workflows/release.yml) is run in a copy of the checkout: it
builds the wheel and "attaches" it, with constraints.txt, to a release. The gate users copy
(examples/ci/github-actions.yml) is then run in a scratch user repository (a checkpoint, a data
file and a curvcal.toml policy, nothing of curvcal's): every `run:` step of its job with bash,
`CI=true`, no TTY (stdin closed) and `GITHUB_STEP_SUMMARY` set to a file, in order, skipping a
step after a failure unless its `if:` says `always()`, as GitHub does; `uses:` steps (checkout,
setup-python, cache, upload) are the runner's and are not run (`python` on PATH is this
environment's, as setup-python would put one there).

What stands in for the network, and nothing else:
- the GitHub CLI is a script on PATH whose releases are folders (`release upload` copies files
  into one, `release download` copies matching files out of it);
- the two gate steps that download (curvcal's constraints, then torch's CPU wheels and curvcal's
  wheel) are replaced: the constraints are copied from the release folder, and the wheel the
  release job built is installed with `pip install --no-deps --no-index --target` on top of this
  test environment's packages (torch and the rest are already here), so the job's `curvcal` is
  that wheel's and not the checkout;
- the release job's `pip wheel` builds without build isolation from this environment's
  setuptools (PIP_NO_INDEX, PIP_NO_BUILD_ISOLATION).
No step that is run contains a URL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

import curvcal
from curvcal.assets import demo_checkpoint, demo_data

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "examples" / "ci" / "github-actions.yml"
RELEASE = ROOT / ".github" / "workflows" / "release.yml"
README = ROOT / "README.md"

FAKE_GH = '''\
"""Stands in for the GitHub CLI: a release is the folder $FAKE_RELEASES/<tag> (latest: the
folder named "latest"); every call is appended to $FAKE_GH_CALLS."""
import fnmatch, os, shutil, sys
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_GH_CALLS"], "a") as calls:
    calls.write(" ".join(args) + "\\n")
releases = Path(os.environ["FAKE_RELEASES"])
if args[:2] == ["release", "upload"]:
    tag, files = args[2], [a for a in args[3:] if not a.startswith("--")]
    for folder in (releases / tag, releases / "latest"):
        folder.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copy(name, folder)
elif args[:2] == ["release", "download"]:
    pattern = args[args.index("--pattern") + 1]
    target = Path(args[args.index("--dir") + 1])
    found = sorted((releases / "latest").glob(pattern)) if (releases / "latest").is_dir() else []
    if not found:
        sys.exit("release not found")
    target.mkdir(parents=True, exist_ok=True)
    for path in found:
        shutil.copy(path, target)
else:
    sys.exit("fake gh: unexpected call " + " ".join(args))
'''


@dataclass
class Run:
    """What a job run left: each step's name and exit status (None: skipped)."""

    steps: dict[str, int | None]
    summary: str
    gh_calls: list[str]


def _step_name(step: dict) -> str:
    return step.get("name") or step.get("uses") or step["run"].splitlines()[0]


def _expand(text: str, context: dict[str, str]) -> str:
    """Replace each `${{ expression }}` by its value in `context`; an unknown one fails."""

    def value(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        assert expression in context, f"the test does not know ${{{{ {expression} }}}}"
        return context[expression]

    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def _should_run(step: dict, event: str, failed: bool) -> bool:
    """GitHub's rule for the two conditions the workflows use (another one fails the test)."""
    condition = step.get("if")
    if condition is None:
        return not failed
    if condition == "always()":
        return True
    assert condition == "github.event_name == 'release'", condition
    return not failed and event == "release"


def run_job(
    workflow: Path,
    job: str,
    repository: Path,
    event: str,
    tools: Path,
    releases: Path,
    context: dict[str, str],
    replaced: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """Run the `run:` steps of `job` in `repository` (a fresh checkout) as a runner would, with
    the fake gh's releases in `releases` (see the module doc)."""
    replaced = dict(replaced or {})
    document = yaml.safe_load(workflow.read_text())
    base_env = {k: _expand(str(v), context) for k, v in (document.get("env") or {}).items()}
    summary = repository.parent / f"{repository.name}-{event}-summary.md"
    summary.write_text("")
    calls = tools / "gh-calls.txt"
    calls.write_text("")
    env = {
        "PATH": f"{tools / 'bin'}:{tools / 'site' / 'bin'}:/usr/bin:/bin",
        "PYTHONPATH": str(tools / "site"),
        "HOME": str(tools / "home"),
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": event,
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_WORKSPACE": str(repository),
        "RUNNER_OS": "Linux",
        "RUNNER_TEMP": str(tools / "runner-temp"),
        "FAKE_RELEASES": str(releases),
        "FAKE_GH_CALLS": str(calls),
        "OMP_NUM_THREADS": "1",
        **base_env,
        **(extra_env or {}),
    }
    results: dict[str, int | None] = {}
    failed = False
    for step in document["jobs"][job]["steps"]:
        name = _step_name(step)
        if "run" not in step:
            assert "uses" in step, step
            continue  # the runner's own actions
        if not _should_run(step, event, failed):
            results[name] = None
            continue
        script = replaced.pop(name, step["run"])
        script = _expand(script, context)
        assert "://" not in script, f"step {name!r} would reach the network"
        step_env = {k: _expand(str(v), context) for k, v in (step.get("env") or {}).items()}
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=repository,
            env={**env, **step_env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        results[name] = done.returncode
        if done.returncode != 0:
            failed = True
            print(f"step {name!r} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    assert not replaced, f"no step named {sorted(replaced)} in {workflow.name}"
    return Run(results, summary.read_text(), calls.read_text().splitlines())


def _tools(folder: Path) -> Path:
    """The fake gh and setup-python's python on PATH, and the folders a job's PATH and PYTHONPATH point at."""
    for name in ("bin", "site", "home", "runner-temp"):
        (folder / name).mkdir(parents=True)
    gh = folder / "bin" / "gh"
    gh.write_text(f"#!{sys.executable}\n{FAKE_GH}")
    gh.chmod(0o755)
    python = folder / "bin" / "python"  # what actions/setup-python puts on PATH: this environment
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return folder


def _checkout_copy(folder: Path) -> Path:
    """What actions/checkout gives the release job: the files a wheel is built from."""
    folder.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, folder)
    shutil.copytree(
        ROOT / "curvcal", folder / "curvcal", ignore=shutil.ignore_patterns("__pycache__")
    )
    return folder


USER_POLICY = """\
[settings]
data = "data/digits.safetensors"
seed = 0
top_k = 1

[accuracy]
min = 0.9

[ece]
max = 0.1

[lambda_max]
max_rel_increase = 0.25
"""


def _user_repository(folder: Path) -> Path:
    """A user's repository: their checkpoint (here the bundled CNN's weights, whose metadata
    names the architecture), 300 images and labels, and a policy; nothing of curvcal's."""
    (folder / "data").mkdir(parents=True)
    shutil.copy(demo_checkpoint(), folder / "model.safetensors")
    data = load_file(str(demo_data()))
    save_file(
        {"x": data["x"][:300].contiguous(), "y": data["y"][:300].contiguous()},
        str(folder / "data" / "digits.safetensors"),
    )
    (folder / "curvcal.toml").write_text(USER_POLICY)
    return folder


def _verdict(summary: str) -> str:
    """The summary's first line that counts the bounds ("... all 3 bounds hold", "... 1 of 3
    ..."): the verdict, wherever the markdown puts it."""
    lines = [line for line in summary.splitlines() if re.search(r"\b(all 3|\d of 3)\b", line)]
    assert lines, summary
    return lines[0]


GITHUB_CONTEXT = {"github.token": "token-not-used"}


# slow: builds curvcal's wheel twice and runs `curvcal check` 3 times in subprocesses (~15 s)
@pytest.mark.slow
def test_the_release_wheel_installs_and_the_copied_gate_judges_a_user_repository(
    tmp_path: Path,
) -> None:
    tools = _tools(tmp_path / "runner")
    tag = f"v{curvcal.__version__}"
    offline_build = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}
    curvcal_releases, user_releases = tmp_path / "curvcal-releases", tmp_path / "user-releases"

    # curvcal's release job refuses a tag that is not the package's version, and attaches nothing
    wrong = run_job(
        RELEASE, "wheel", _checkout_copy(tmp_path / "wrong"), "release", tools, curvcal_releases,
        {**GITHUB_CONTEXT, "github.event.release.tag_name": "v9.9.9"}, extra_env=offline_build,
    )  # fmt: skip
    assert list(wrong.steps.values()) == [1, None], wrong.steps
    assert wrong.gh_calls == [] and not curvcal_releases.exists()

    # curvcal's release job: the wheel and the constraints attached to the release
    released = run_job(
        RELEASE, "wheel", _checkout_copy(tmp_path / "curvcal"), "release", tools, curvcal_releases,
        {**GITHUB_CONTEXT, "github.event.release.tag_name": tag}, extra_env=offline_build,
    )  # fmt: skip
    assert set(released.steps.values()) == {0}, released.steps
    release = curvcal_releases / tag
    wheel = release / f"curvcal-{curvcal.__version__}-py3-none-any.whl"
    assert (
        wheel.is_file()
        and (release / "constraints.txt").read_bytes() == (ROOT / "constraints.txt").read_bytes()
    )

    # the gate, copied into a user's repository: the two download steps replaced (module doc);
    # every run starts from a fresh checkout of that repository, as on a runner
    user = _user_repository(tmp_path / "user")
    install = {
        "Fetch curvcal's constraints": f"cp {release / 'constraints.txt'} curvcal-constraints.txt",
        "Install curvcal": (
            f"python -m pip install -q --no-deps --no-index --target {tools / 'site'} {wheel}\n"
            "rm curvcal-constraints.txt"
        ),
    }
    gate_context = {**GITHUB_CONTEXT, "github.event.release.tag_name": "v2.0.0"}

    def gate(run: str, event: str) -> tuple[Run, Path]:
        checkout = shutil.copytree(user, tmp_path / run)
        return run_job(
            GATE, "gate", checkout, event, tools, user_releases, gate_context, install
        ), checkout

    first, checkout = gate("first", "pull_request")
    assert first.steps == {
        "Fetch curvcal's constraints": 0,
        "Install curvcal": 0,
        "Baseline from the previous release": 0,  # none yet: said, not failed
        "curvcal check": 1,  # no baseline: the change bound fails
        "Attach the report to the release (the next baseline)": None,
    }
    assert first.gh_calls == ["release download --pattern curvcal-check.json --dir baseline"]
    report = json.loads((checkout / "curvcal-check.json").read_text())
    assert report["status"] == "fail"
    assert [row["reason"] for row in report["results"]["rows"] if not row["passed"]] == [
        "no baseline"
    ]
    assert "1 of 3" in _verdict(first.summary)
    assert "| lambda_max |" in first.summary
    assert not (checkout / "curvcal-constraints.txt").exists()  # nothing left in the user's tree

    # the curvcal the job ran is the release's wheel, not this checkout
    where = subprocess.run(
        [sys.executable, "-c", "import curvcal; print(curvcal.__file__)"],
        env={"PYTHONPATH": str(tools / "site"), "PATH": "/usr/bin:/bin"}, cwd=checkout,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(tools / "site")
    assert os.access(tools / "site" / "bin" / "curvcal", os.X_OK)

    # the user attaches that first report to their release by hand (the workflow's comment):
    # the next pull request downloads it as the baseline, and the same numbers pass every bound
    (user_releases / "latest").mkdir(parents=True)
    shutil.copy(checkout / "curvcal-check.json", user_releases / "latest")
    second, checkout = gate("second", "pull_request")
    assert second.steps["curvcal check"] == 0, second.steps
    assert (checkout / "baseline" / "curvcal-check.json").is_file()
    assert "all 3" in _verdict(second.summary)
    assert json.loads((checkout / "curvcal-check.json").read_text())["status"] == "pass"

    # a published release: the gate passes and attaches its report, the next baseline
    published, checkout = gate("published", "release")
    assert published.steps["curvcal check"] == 0
    assert published.steps["Attach the report to the release (the next baseline)"] == 0
    assert published.gh_calls[-1] == "release upload v2.0.0 curvcal-check.json --clobber"
    attached = user_releases / "v2.0.0" / "curvcal-check.json"
    assert attached.read_bytes() == (checkout / "curvcal-check.json").read_bytes()


def test_the_readme_gate_section_is_the_example_job() -> None:
    blocks = re.findall(r"^```yaml\n(.*?)^```$", README.read_text(), re.MULTILINE | re.DOTALL)
    assert blocks == [GATE.read_text()]
