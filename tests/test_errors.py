"""Error messages: one line, long values cut in one place."""

from __future__ import annotations

from curvcal.errors import LONGEST_WORD, InputError, shorten


def test_short_words_are_kept_whole() -> None:
    word = "x" * LONGEST_WORD
    assert shorten(word) == word


def test_long_words_keep_their_ends_length_and_punctuation() -> None:
    value = "a" * 500 + "TAIL"
    assert shorten(value) == "a" * 60 + "…" + "a" * 16 + "TAIL [504 characters]"
    assert shorten(f"'{value}':") == "'" + "a" * 60 + "…" + "a" * 16 + "TAIL' [504 characters]:"


def test_the_message_cuts_what_why_and_hint_and_stays_one_line() -> None:
    long = "b" * 100_000
    error = InputError(f"--arch {long}", f"no model\n'{long}'", f"try {long}")
    assert len(error.message) < 400 and "\n" not in error.message
    assert error.message.count("[100,000 characters]") == 3


def test_a_setting_is_named_in_the_words_of_whoever_reads_it() -> None:
    """A setting has one name, its field: Python reads it as the field, the command line as the
    option, and the wording set for a block is undone after it (nested blocks too)."""
    from curvcal.errors import SettingsError, as_option, setting_name, wording

    assert setting_name("probe_batch") == "probe_batch"
    with wording(as_option):
        assert setting_name("probe_batch") == "--probe-batch"
        with wording(lambda field: field.upper()):
            assert setting_name("probe_batch") == "PROBE_BATCH"
        error = SettingsError("loss", "needs --gamma", value="focal")
        assert error.message == "--loss focal: needs --gamma" and error.field == "loss"
    assert setting_name("probe_batch") == "probe_batch"
    assert SettingsError("top_k", "must be ≥ 1").message == "top_k: must be ≥ 1"
