"""``--format junit``: a judged run as JUnit XML, the file CI test reporters read.

The layout is the one Jenkins, GitLab and the GitHub test-reporter actions read (Ant's
``junit-10.xsd``): a ``<testsuites>`` holding one ``<testsuite>`` (name, ``tests``,
``failures``, ``errors``, ``skipped``, ``time``) with ``<properties>`` saying what was judged
(``checkpoint``, or ``new`` for ``compare``, and its SHA-256, data and N, policy, baseline and its release, curvcal version), and
one ``<testcase>`` per bound: ``classname`` the metric as the policy keys it (``ece``,
``ts.ece``, ``lambda_max``), ``name`` the bound (``max <= 0.05``). A broken bound holds a
``<failure>`` whose ``message`` gives the value, its 95 % interval and the bound; ``errors``
and ``skipped`` are always 0 (a run that cannot judge exits 2 or 3 without a report).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from curvcal.report.judged import JudgedRun, row_message
from curvcal.report.verdict import verdict_words


def junit_xml(judged: JudgedRun) -> str:
    """The JUnit XML document of ``judged`` (UTF-8, with its declaration)."""
    rows = judged.verdict.rows
    failures = len(judged.verdict.failed_rows)
    counts = {
        "tests": str(len(rows)),
        "failures": str(failures),
        "errors": "0",
        "skipped": "0",
        "time": f"{judged.seconds:.3f}",
    }
    name = _text(f"curvcal {judged.command}: {judged.model.name}")
    suites = ET.Element("testsuites", {"name": f"curvcal {judged.command}", **counts})
    suite = ET.SubElement(suites, "testsuite", {"name": name, **counts})
    properties = ET.SubElement(suite, "properties")
    for key, value in _properties(judged):
        ET.SubElement(properties, "property", {"name": key, "value": _text(value)})
    for row in rows:
        case = ET.SubElement(
            suite,
            "testcase",
            {"classname": _text(row.metric), "name": f"{row.bound} {row.bound_text}", "time": "0"},
        )
        if not row.passed:
            message = _text(row_message(row))
            failure = ET.SubElement(
                case, "failure", {"message": message, "type": row.reason or "bound"}
            )
            failure.text = message
    ET.SubElement(suite, "system-out").text = verdict_words(judged.verdict)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


#: characters XML 1.0 cannot hold, even escaped (control characters but tab, newline, return)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: str) -> str:
    """``value`` with the characters XML cannot hold replaced by U+FFFD (ElementTree would
    write them, and the file would not parse)."""
    return _NOT_XML.sub("\ufffd", value)


def _properties(judged: JudgedRun) -> list[tuple[str, str]]:
    role = judged.model_role
    found = [(role, judged.model.path)]
    if judged.model.sha256:
        found.append((f"{role}.sha256", judged.model.sha256))
    if judged.data_spec:
        found.append(("data", judged.data_spec))
    if judged.n_samples is not None:
        found.append(("data.n_samples", str(judged.n_samples)))
    if judged.policy:
        found.append(("policy", judged.policy))
    if judged.baseline is not None:
        found.append(("baseline", judged.baseline.path))
        for key in ("sha256", "tag", "commit"):
            if getattr(judged.baseline, key):
                found.append((f"baseline.{key}", getattr(judged.baseline, key)))
    found.append(("curvcal", judged.version))
    return found
