"""``--metrics-config summary_quantiles`` numbers read as Triton's core reads them, with C++ ``std::stod``
(kserve_v2.settings.metrics_config.stod): the longest numeric prefix counts, and only a string with no
number at all (or one out of a double's range) fails."""

from __future__ import annotations

import math

import pytest

from kserve_v2.settings.metrics_config import parse_metrics_config, stod

# what std::stod returns (or throws) for each string, printed by a C++ program built with g++ 12 (glibc)
STOD = [
    ("0.0.1", 0.0), ("0.1", 0.1), (" 0.5abc", 0.5), ("\t 7", 7.0), ("1e", 1.0), ("1e-2x", 0.01), (".5", 0.5),
    ("5.", 5.0), ("1.e1", 10.0), ("-0.25", -0.25), ("+.5e+3", 500.0), ("00012", 12.0), ("0x1p-2", 0.25),
    ("0x.8", 0.5), ("0X1P", 1.0), ("0x", 0.0), ("0x.p1", 0.0), ("0x1.8p1", 3.0), ("0x1p-1074", 5e-324),
    ("0e-400", 0.0), ("inf", math.inf), ("-Infinity", -math.inf), ("infinit", math.inf),
    ("2.2250738585072014e-308", 2.2250738585072014e-308), ("1.7976931348623157e308", 1.7976931348623157e308),
]
INVALID = ["abc", "", ".", "-", "e5", ".e1", " - 1"]  # std::invalid_argument
OUT_OF_RANGE = ["1e999", "1e-400", "4e-320", "1e-310", "0x1p99999",  # std::out_of_range (glibc's ERANGE)
                "2.2250738585072011e-308", "1.7976931348623159e308"]


@pytest.mark.parametrize(("text", "value"), STOD)
def test_the_longest_numeric_prefix_is_read(text: str, value: float) -> None:
    assert stod(text) == value


def test_nans_with_or_without_a_payload() -> None:
    assert all(math.isnan(stod(text)) for text in ("nan", "NaN(abc_1)", "nan()", "nanx", "-nan"))


@pytest.mark.parametrize("text", INVALID + OUT_OF_RANGE)
def test_no_number_or_one_out_of_range_fails(text: str) -> None:
    with pytest.raises(ValueError, match="no number" if text in INVALID else "out of a double's range"):
        stod(text)


def test_l0_metrics_summary_quantiles() -> None:
    """qa/L0_metrics test.sh's value: the error of the first pair, ``0.0.1``, is 0.0, and the pair is kept."""
    config = parse_metrics_config(["summary_quantiles=0.1:0.0.1,0.7:0.01,0.75:0.01"])
    assert config.summary_quantiles == ((0.1, 0.0), (0.7, 0.01), (0.75, 0.01))


@pytest.mark.parametrize("value", ["0.5", "abc:0.01", "0.5:x", "1.5:0.01", "0.5:1e999"])
def test_what_triton_skips_or_ends_on_is_a_usage_error(value: str) -> None:
    with pytest.raises(ValueError, match=f"invalid pair '{value}'"):
        parse_metrics_config([f"summary_quantiles={value}"])
