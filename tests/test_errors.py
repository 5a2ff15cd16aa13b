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
