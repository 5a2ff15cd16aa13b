"""The bounded JSON reader: depth and integer limits, and the wide integers of library metadata."""

from __future__ import annotations

import json

import pytest

from curvcal import jsontext
from curvcal.errors import InputError

# what transformers writes as a tokenizer's model_max_length when there is no limit: int(1e30)
VERY_LARGE = 1000000000000000019884624838656


def test_int64_edges_are_read_exactly() -> None:
    text = json.dumps({"a": 2**63 - 1, "b": -(2**63 - 1)})
    assert jsontext.loads(text, "x.json") == {"a": 2**63 - 1, "b": -(2**63 - 1)}


def test_an_integer_past_64_bits_is_refused_naming_the_file() -> None:
    with pytest.raises(InputError, match="outside the 64-bit range") as caught:
        jsontext.loads(json.dumps({"label": 2**63}), "labels.jsonl:3")
    assert "labels.jsonl:3" in str(caught.value)


def test_library_metadata_reads_transformers_very_large_integer_as_its_float() -> None:
    document = jsontext.loads(
        json.dumps({"model_max_length": VERY_LARGE}), "t.json", wide_ints=True
    )
    assert document == {"model_max_length": float(VERY_LARGE)}
    assert isinstance(document["model_max_length"], float)
    # within the 64-bit range an integer stays an integer
    assert jsontext.loads("[7]", "t.json", wide_ints=True) == [7]


def test_library_metadata_still_refuses_an_integer_past_float_range() -> None:
    with pytest.raises(InputError, match="outside the 64-bit range"):
        jsontext.loads("[" + "9" * 309 + "]", "config.json", wide_ints=True)
    # 308 digits is the border: 10**308 - 1 fits a float64
    assert jsontext.loads("[" + "9" * 308 + "]", "config.json", wide_ints=True) == [1e308]


def test_depth_is_refused_before_the_decoder_recurses() -> None:
    with pytest.raises(InputError, match="nested more than 100 levels"):
        jsontext.loads("[" * 101 + "]" * 101, "deep.json")
    assert jsontext.loads("[" * 100 + "]" * 100, "ok.json") is not None


def test_a_key_given_twice_is_refused_naming_the_file_and_the_key() -> None:
    # the standard decoder keeps the last value: {"temperature": 1.5, "temperature": 1e-30}
    # would be read as 1e-30 by curvcal and as 1.5 by a reader who stops at the first
    text = '{"ts": {"method": "temperature", "temperature": 1.5, "temperature": 0.25}}'
    with pytest.raises(InputError, match="'temperature' appears more than once") as caught:
        jsontext.loads(text, "c.json")
    assert "c.json" in str(caught.value)
    # the same key in two different objects is not a repeat
    assert jsontext.loads('[{"a": 1}, {"a": 2}]', "c.json") == [{"a": 1}, {"a": 2}]
