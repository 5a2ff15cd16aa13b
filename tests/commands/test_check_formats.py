"""`curvcal check`/`compare` outputs for every consumer, each from a real run on the bundled
checkpoint: JUnit XML (validated against tests/data/junit-10.xsd), GitHub workflow commands,
one self-contained HTML page, a Hugging Face model-index block read back by huggingface_hub,
and markdown that opens with the verdict and names the baseline's release. Every figure shown
is compared with the JSON report of the same run."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from curvcal.assets import demo_checkpoint

DATA = Path(__file__).resolve().parents[1] / "data"

# Light settings: 120 digits, no γ grid, one Lanczos eigenvalue at a loose tolerance. With
# bootstrap, smooth_ece carries a 95% interval: 0.0337 [0, 0.0793] on these digits, so a bound
# of 0.06 holds and straddles it (borderline) and 0.01 breaks it, straddling it too.
SETTINGS = """\
[settings]
data = "curvcal:digits"
device = "cpu"
max_samples = 120
gammas = [0]
top_k = 1
eigen_method = "lanczos"
tol = 1e-2
bootstrap = 200
"""
FAILING = (
    SETTINGS
    + """
[accuracy]
min = 0.5
[ece]
max = 0.02
[smooth_ece]
max = 0.06
[lambda_max]
max = 1000
"""
)
PASSING = SETTINGS + "\n[accuracy]\nmin = 0.5\n[ts.ece]\nmax = 0.5\n"


def check(run_cli, tmp_path: Path, policy: str, *extra: Any, model: Path | None = None) -> Any:
    gate = tmp_path / "gate.toml"
    gate.write_text(policy)
    result = run_cli("check", model or demo_checkpoint(), "--policy", gate, "-q", *extra)
    assert result.code in (0, 1), result.output
    return result


def rows_of(report: Path) -> list[dict[str, Any]]:
    return json.loads(report.read_text())["results"]["rows"]


def test_junit_has_one_case_per_bound_and_failures_with_value_bound_and_interval(
    run_cli, tmp_path: Path
) -> None:
    result = check(run_cli, tmp_path, FAILING, "--format", "junit", "-o", tmp_path / "r.json")
    assert result.code == 1
    rows = rows_of(tmp_path / "r.json")
    root = ET.fromstring(result.stdout)
    (suite,) = root.findall("testsuite")
    assert root.tag == "testsuites"
    for element in (root, suite):
        assert element.get("tests") == str(len(rows)) == "4"
        assert element.get("failures") == str(sum(not r["passed"] for r in rows)) == "1"
        assert element.get("errors") == "0" and element.get("skipped") == "0"
        assert float(element.get("time", "-1")) >= 0
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("accuracy", "min >= 0.5"),
        ("ece", "max <= 0.02"),
        ("smooth_ece", "max <= 0.06"),
        ("lambda_max", "max <= 1000"),
    ]
    (failure,) = [f for c in cases for f in c.findall("failure")]
    ece = next(r for r in rows if r["metric"] == "ece")
    low, high = ece["interval"]
    assert failure.get("message") == (
        f"ece = {ece['value']:.4g} [{low:.4g}, {high:.4g}], bound <= 0.02: {ece['reason']}"
    )
    assert failure.text == failure.get("message") and ece["reason"].startswith("value above max")
    smooth = next(r for r in rows if r["metric"] == "smooth_ece")
    low, high = smooth["interval"]
    assert smooth["passed"] and low <= 0.06 <= high  # the borderline row the policy meant
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["checkpoint"] == str(demo_checkpoint())
    assert properties["data"] == "curvcal:digits" and properties["data.n_samples"] == "120"
    assert properties["checkpoint.sha256"] == json.loads((tmp_path / "r.json").read_text())[
        "inputs"]["checkpoint"]["sha256"]  # fmt: skip


def test_junit_file_is_valid_against_the_junit_schema(run_cli, tmp_path: Path) -> None:
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema comes with the dev extra")
    schema = xmlschema.XMLSchema(DATA / "junit-10.xsd")
    check(run_cli, tmp_path, FAILING, "-o", tmp_path / "junit.xml")
    schema.validate(tmp_path / "junit.xml")
    # the schema is not empty: a case outside a suite and a suite without counts are refused
    for broken in ('<testsuites><testcase name="x"/></testsuites>',
                   '<testsuites><testsuite name="s"/></testsuites>'):  # fmt: skip
        assert not schema.is_valid(broken)


def test_github_annotates_broken_and_borderline_bounds_then_the_summary(
    run_cli, tmp_path: Path
) -> None:
    result = check(run_cli, tmp_path, FAILING, "--format", "github", "-o", tmp_path / "r.json")
    rows = {r["metric"]: r for r in rows_of(tmp_path / "r.json")}
    lines = result.stdout.splitlines()
    ece, smooth = rows["ece"], rows["smooth_ece"]
    assert lines[0] == (
        "::error title=curvcal check broken%3A ece <= 0.02 (digits_cnn.safetensors)::"
        f"ece = {ece['value']:.4g} [{ece['interval'][0]:.4g}, {ece['interval'][1]:.4g}], "
        f"bound <= 0.02: {ece['reason'].replace('%', '%25')}"
    )
    assert smooth["passed"] and smooth["interval"][0] <= 0.06 <= smooth["interval"][1]
    assert lines[1] == (
        "::warning title=curvcal check borderline%3A smooth_ece <= 0.06 (digits_cnn.safetensors)"
        f"::smooth_ece = {smooth['value']:.4g} [{smooth['interval'][0]:.4g}, "
        f"{smooth['interval'][1]:.4g}], bound <= 0.06: {smooth['reason'].replace('%', '%25')} "
        "(held, but the 95%25 interval straddles the bound)"
    )
    assert not any(line.startswith("::") for line in lines[2:])
    # ece is borderline too (its interval reaches below 0.02), but broken: an error only
    assert lines[2] == (
        "## ❌ FAIL: 1 of 4 bounds broken (2 borderline: the 95% interval straddles the bound)"
    )


def test_github_escapes_percent_newline_colon_and_comma() -> None:
    from curvcal.report.github import escape_data, escape_property

    assert escape_data("50% of a\r\nb: c, d") == "50%25 of a%0D%0Ab: c, d"
    assert escape_property("50% of a\r\nb: c, d") == "50%25 of a%0D%0Ab%3A c%2C d"
    assert escape_data("%0A") == "%250A"  # an escape in the text is not read as one


def test_github_escapes_a_model_name_in_the_title(run_cli, tmp_path: Path) -> None:
    model = tmp_path / "a,b%c.safetensors"
    shutil.copyfile(demo_checkpoint(), model)
    result = check(run_cli, tmp_path, FAILING, "--format", "github", model=model)
    assert "(a%2Cb%25c.safetensors)::ece = " in result.stdout.splitlines()[0]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.links += [v or "" for k, v in attrs if k in ("src", "href", "srcset", "data")]


def test_html_page_is_self_contained_with_the_verdict_first(run_cli, tmp_path: Path) -> None:
    result = check(run_cli, tmp_path, FAILING, "-o", tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert result.code == 1 and "<table>" not in result.stdout  # stdout kept its table
    assert page.startswith("<!DOCTYPE html>")
    parsed = _Links()
    parsed.feed(page)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert not re.search(r"https?://", page.split("<body>")[1].replace("base64,", ""))
    assert parsed.links and all(link.startswith("data:image/svg+xml;base64,")
                                for link in parsed.links)  # fmt: skip
    assert len(parsed.links) == 2  # the reliability diagram and the spectrum (plot extra)
    body = page.split("<body>")[1]
    assert body.index("❌ FAIL: 1 of 4 bounds broken") < body.index("<table>")
    assert '<tr class="broken"><td>ece</td>' in page
    assert '<td class="num">' in page


def test_html_is_offered_to_every_command_and_verdict_formats_only_to_judges(
    run_cli, tmp_path: Path
) -> None:
    page = run_cli("inspect", demo_checkpoint(), "--format", "html")
    assert page.code == 0 and page.stdout.startswith("<!DOCTYPE html>")
    assert "<h1>curvcal inspect</h1>" in page.stdout and "data:image" not in page.stdout
    calibrated = run_cli("calibrate", demo_checkpoint(), "--data", "curvcal:digits",
                         "--max-samples", "60", "--method", "ts", "--format", "html", "-q")  # fmt: skip
    assert calibrated.code == 0, calibrated.output
    assert calibrated.stdout.count('src="data:image/svg+xml;base64,') == 1  # its diagram
    for asked in (("--format", "junit"), ("-o", tmp_path / "j.xml"),
                  ("--format", "model-card"), ("--format", "github")):  # fmt: skip
        refused = run_cli("inspect", demo_checkpoint(), *asked)
        assert refused.code == 2 and "curvcal inspect judges nothing" in refused.stderr
        assert not list(tmp_path.iterdir())


def test_model_card_is_read_back_by_huggingface_hub(run_cli, tmp_path: Path) -> None:
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub comes with the hf extra")
    from huggingface_hub.repocard_data import model_index_to_eval_results

    result = check(run_cli, tmp_path, FAILING, "--format", "model-card", "-o", tmp_path / "r.json")
    rows = rows_of(tmp_path / "r.json")
    card = hub.ModelCard(result.stdout + "\n# digits CNN\n")
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == "digits_cnn.safetensors"
    assert [(r.metric_type, r.metric_value) for r in results] == [
        (row["metric"], row["value"]) for row in rows
    ]
    assert {(r.task_type, r.dataset_type, r.dataset_name) for r in results} == {
        ("image-classification", "curvcal:digits", "curvcal:digits")
    }
    (tmp_path / "README.md").write_text(result.stdout)
    loaded = hub.metadata_load(tmp_path / "README.md")
    assert loaded is not None and loaded["model-index"][0]["results"][0]["metrics"][0] == {
        "name": "accuracy", "type": "accuracy", "value": rows[0]["value"]
    }  # fmt: skip


def test_markdown_opens_with_the_verdict_and_names_the_baseline_release(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = tmp_path / "release.json"
    for name, value in (("GITHUB_SHA", "0123456789abcdef0123"), ("GITHUB_REF_TYPE", "tag"),
                        ("GITHUB_REF_NAME", "v1.2")):  # fmt: skip
        monkeypatch.setenv(name, value)
    check(run_cli, tmp_path, PASSING + "[ece]\nmax = 1\n", "-o", release)
    recorded = json.loads(release.read_text())["environment"]["revision"]
    assert recorded == {"commit": "0123456789abcdef0123", "tag": "v1.2"}
    for name in ("GITHUB_SHA", "GITHUB_REF_TYPE", "GITHUB_REF_NAME"):
        monkeypatch.delenv(name)
    policy = PASSING + "[ece]\nmax_increase = 0.5\n"
    result = check(run_cli, tmp_path, policy, "--baseline", release, "--format", "markdown",
                   "-o", tmp_path / "summary.md")  # fmt: skip
    lines = result.stdout.splitlines()
    assert lines[0] == "## ✅ PASS: all 3 bounds hold"
    digest = hashlib.sha256(release.read_bytes()).hexdigest()
    assert f"baseline: release.json (tag v1.2, commit 0123456789ab, sha256 {digest[:12]})" in lines
    assert result.stdout.index("| metric |") < result.stdout.index("what was measured")
    assert (tmp_path / "summary.md").read_text() == result.stdout


def test_compare_renders_the_same_verdict_formats(run_cli, tmp_path: Path) -> None:
    check(run_cli, tmp_path, FAILING, "-o", tmp_path / "new.json")
    gate = tmp_path / "gate.toml"
    result = run_cli("compare", tmp_path / "new.json", tmp_path / "new.json", "--policy", gate,
                     "--format", "junit")  # fmt: skip
    assert result.code == 1, result.output
    suite = ET.fromstring(result.stdout).find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "4"
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["baseline"] == properties["new"] == str(tmp_path / "new.json")


def test_an_output_file_never_replaces_an_input_whatever_its_format(
    run_cli, tmp_path: Path
) -> None:
    release = tmp_path / "release.html"  # a saved report whose name asks for a page
    release.write_text(check(run_cli, tmp_path, PASSING, "--json").stdout)
    before = release.read_bytes()
    result = run_cli("check", demo_checkpoint(), "--policy", tmp_path / "gate.toml",
                     "--baseline", release, "-o", release, "--force")  # fmt: skip
    assert result.code == 2 and release.read_bytes() == before


def test_source_revision_reads_github_and_gitlab_variables() -> None:
    from curvcal.pipeline.provenance import source_revision

    assert source_revision({}) == {}
    assert source_revision({"GITHUB_SHA": "abc", "GITHUB_REF_TYPE": "branch",
                            "GITHUB_REF_NAME": "main"}) == {"commit": "abc"}  # fmt: skip
    assert source_revision({"CI_COMMIT_SHA": "def", "CI_COMMIT_TAG": "v2"}) == {
        "commit": "def", "tag": "v2"
    }  # fmt: skip


def test_a_passing_check_annotates_nothing_and_reports_no_failure(run_cli, tmp_path: Path) -> None:
    result = check(run_cli, tmp_path, PASSING, "--format", "github", "-o", tmp_path / "j.xml")
    assert result.code == 0
    assert result.stdout.splitlines()[0] == "## ✅ PASS: all 2 bounds hold"
    assert "::" not in result.stdout
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert root.get("tests") == "2" and root.get("failures") == "0"
    assert not list(root.iter("failure"))
