"""The time left and the plain progress lines, driven by a hand-set clock (no real time)."""

from __future__ import annotations

from curvcal.pace import LINE_SECONDS, Pace, PlainLines, duration_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_left_from_the_pace_since_the_first_report() -> None:
    clock = FakeClock()
    pace = Pace(100, clock)
    clock.now = 50.0  # loading and the first product: not timed
    pace.update(1)
    assert pace.remaining() is None  # one report: no pace yet
    clock.now = 58.0
    pace.update(5)  # 4 products in 8 s: 2 s each, 95 left
    assert pace.seconds_per_unit() == 2.0
    assert pace.remaining() == 190.0
    clock.now = 98.0
    pace.update(15)  # revised: 14 products in 48 s
    assert abs(pace.remaining() - 85 * 48 / 14) < 1e-9
    assert pace.text() == "15/100, about 5 min left"


def test_a_total_the_work_outgrows_becomes_the_count_and_a_new_plan_replaces_it() -> None:
    clock = FakeClock()
    pace = Pace(10, clock)
    pace.update(1)
    clock.now = 1.0
    pace.update(12)
    assert pace.total == 12 and pace.remaining() == 0.0
    pace.plan(40)
    assert pace.total == 40 and abs(pace.remaining() - 28 / 11) < 1e-9
    uncountable = Pace(None, clock)
    uncountable.update(3)
    assert uncountable.total is None and uncountable.text() == "3"


def test_duration_text() -> None:
    assert duration_text(42) == "42 s"
    assert duration_text(600) == "10 min"
    assert duration_text(9000) == "2.5 h"


def test_plain_lines_every_tenth_of_the_total() -> None:
    clock = FakeClock()
    lines: list[str] = []
    plain = PlainLines("products", 100, lines.append, clock)
    for done in range(1, 101):
        clock.now = done * 0.01  # fast: the 10% rule, never the 30 s one
        plain.update(done)
    plain.finish()
    # the first report (the stage), one at each further 10 products, and the last count
    assert len(lines) == 11, lines
    assert lines[0].startswith("curvcal: products: 1/100")
    assert lines[-2].startswith("curvcal: products: 91/100")
    assert lines[-1] == "curvcal: products: 100/100, about 0 s left"


def test_plain_lines_every_30_seconds_when_progress_is_slow() -> None:
    clock = FakeClock()
    lines: list[str] = []
    plain = PlainLines("trace", 10_000, lines.append, clock)
    plain.update(1)
    for done in range(2, 40):
        clock.now += 10.0  # 10 s a product, far under 10% per line
        plain.update(done)
    # 38 updates 10 s apart after the first line: a line at each 30 s
    assert len(lines) == 1 + 380 // int(LINE_SECONDS)
    assert all(line.startswith("curvcal: trace: ") for line in lines)


def test_plain_lines_say_a_new_stage_at_once() -> None:
    clock = FakeClock()
    lines: list[str] = []
    plain = PlainLines("eigenvalues", 100, lines.append, clock)
    plain.update(1)
    plain.update(2)
    plain.describe("trace")
    plain.update(3)
    assert [line.split(":")[1].strip() for line in lines] == ["eigenvalues", "trace"]


def test_the_terminal_bar_shows_total_and_time_left(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    from rich.console import Console

    from curvcal import console as console_module
    from curvcal.console import Reporter

    stream = io.StringIO()
    monkeypatch.setattr(
        console_module,
        "stderr_console",
        lambda: Console(file=stream, force_terminal=True, width=120, color_system=None),
    )
    clock = FakeClock()
    with Reporter(clock=clock).progress("Hessian-vector products", 10) as advance:
        advance(1)
        clock.now = 20.0
        advance(4)  # 4 products in 20 s: 5 s each, 5 left
        advance.plan(14)  # the run resolved its settings: 9 left
    shown = stream.getvalue()
    assert "5/14, about 45 s left" in shown


def test_off_a_terminal_lines_begin_after_the_first_seconds(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    from rich.console import Console

    from curvcal import console as console_module
    from curvcal.console import Reporter
    from curvcal.pace import PLAIN_GRACE_SECONDS

    stream = io.StringIO()
    monkeypatch.setattr(console_module, "stderr_console", lambda: Console(file=stream, width=200))
    clock = FakeClock()
    reporter = Reporter(clock=clock)
    reporter.stage("loading model.safetensors")
    assert stream.getvalue() == ""  # a quick run says nothing
    with reporter.progress("products", 100) as advance:
        advance(1)
        assert stream.getvalue() == ""
        clock.now = PLAIN_GRACE_SECONDS + 1
        advance(1)  # the held stage line, then the count
    lines = stream.getvalue().splitlines()
    assert lines[0] == "curvcal: loading model.safetensors"
    assert lines[1].startswith("curvcal: products: 2/100")


def test_a_new_stage_is_timed_afresh() -> None:
    clock = FakeClock()
    lines: list[str] = []
    plain = PlainLines("eigenvalues", 100, lines.append, clock)
    plain.update(1)
    clock.now = 40.0
    plain.update(5)  # 10 s a product
    plain.describe("layers")
    clock.now = 41.0
    plain.update(6)  # the new stage's first report: the last pace still holds
    assert plain.pace.seconds_per_unit() == 10.0
    clock.now = 45.0
    plain.update(10)  # 4 products in 4 s: 1 s each from now on
    assert plain.pace.seconds_per_unit() == 1.0 and plain.pace.remaining() == 90.0


def test_off_a_terminal_a_stage_line_waits_for_a_count(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A slow start that then stops on bad input says only its error line."""
    import io

    from rich.console import Console

    from curvcal import console as console_module
    from curvcal.console import Reporter

    stream = io.StringIO()
    monkeypatch.setattr(console_module, "stderr_console", lambda: Console(file=stream, width=200))
    clock = FakeClock()
    reporter = Reporter(clock=clock)
    clock.now = 60.0  # a minute of loading
    reporter.stage("checking that the model takes the data")
    assert stream.getvalue() == ""


def test_a_typical_count_left_is_said_as_a_range_and_a_known_one_as_a_point() -> None:
    clock = FakeClock()
    # 14 eigenvalue products (a typical count, done first) then 20 trace probes (known)
    pace = Pace(34, clock, typical=14)
    pace.update(1)
    clock.now = 4.0
    pace.update(3)  # 2 s a product; 11 typical and 20 known left
    low, high = pace.remaining_range()  # type: ignore[misc]
    assert low == (20 + 0.4 * 11) * 2.0 and high == (20 + 2.0 * 11) * 2.0
    assert pace.text() == "3/34, about 49 s to 84 s left"
    # the eigenvalue stage ended after 6 products: the plan says so, and the rest is known
    pace.plan(26, typical=0)
    clock.now = 10.0
    pace.update(6)
    assert pace.remaining_range() == (20 * 2.0, 20 * 2.0)
    assert pace.text() == "6/26, about 40 s left"


def test_an_unbounded_typical_count_gives_only_a_least_time() -> None:
    clock = FakeClock()
    pace = Pace(60, clock, typical=60, typical_bounded=False)  # power iteration, 3 values
    pace.update(1)
    clock.now = 1.0
    pace.update(11)  # 0.1 s a product, 49 typical left
    assert pace.remaining_range() == (0.4 * 49 * 0.1, None)
    assert pace.text() == "11/60, at least 2 s left"


def test_work_that_outgrows_its_plan_says_the_time_left_is_not_known() -> None:
    clock = FakeClock()
    pace = Pace(60, clock, typical=60, typical_bounded=False)
    pace.update(1)
    clock.now = 10.0
    pace.update(60)
    assert pace.text() == "60/60, about 0 s left"  # border: exactly the plan is no overrun
    clock.now = 30.0
    pace.update(125)
    assert pace.outgrown and pace.remaining_range() is None
    assert pace.text() == "125 (60 planned), time left not known"


def test_units_of_a_stage_not_yet_begun_widen_the_range_by_their_unknown_cost() -> None:
    clock = FakeClock()
    # 11 Lanczos products (typical) of which 3 done, then 20 trace probes, whose cost per
    # product is not measured yet (ResNet-18 on a CPU: 1.9× a Lanczos product)
    pace = Pace(34, clock, typical=14, stage_end=14)
    pace.update(1)
    clock.now = 4.0
    pace.update(3)  # 2 s a product
    low, high = pace.remaining_range()  # type: ignore[misc]
    assert low == (0.4 * 11 + 0.5 * 20) * 2.0 and high == (2.0 * 11 + 2.0 * 20) * 2.0
    # in the trace stage its own pace is measured: the rest of it is a point again
    pace.plan(26, typical=0, stage_end=26)
    pace.restart()
    clock.now = 10.0
    pace.update(7)
    clock.now = 16.0
    pace.update(10)  # 2 s a probe
    assert pace.remaining_range() == (32.0, 32.0) and pace.text() == "10/26, about 32 s left"


def test_a_revised_plan_reaches_the_plain_lines_and_a_quiet_run_ignores_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Advance.plan is the pace's own plan (off a terminal) or nothing (quiet): the total a
    revision gives is the one the next line counts against, with every argument Pace.plan
    takes."""
    import io

    from rich.console import Console

    from curvcal import console as console_module
    from curvcal.console import Reporter
    from curvcal.pace import PLAIN_GRACE_SECONDS

    stream = io.StringIO()
    monkeypatch.setattr(console_module, "stderr_console", lambda: Console(file=stream, width=200))
    clock = FakeClock()
    with Reporter(clock=clock).progress("products", 100) as advance:
        advance.plan(40, 10, False, 20)
        clock.now = PLAIN_GRACE_SECONDS + 1
        advance(1)
    assert stream.getvalue().splitlines()[0].startswith("curvcal: products: 1/40")
    with Reporter(quiet=True, clock=clock).progress("products", 100) as quiet:
        quiet.plan(40, 10, False, 20)
        quiet(1)
    assert stream.getvalue().count("products") == 1
