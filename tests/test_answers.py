"""Tests for common/answers.py: reading the final answer, canonical Unicode and number notation, the
exact-match normalisation, all in linear time on raw model output."""

import functools
import random
import time
import unicodedata

import pytest

from common.answers import (
    balanced,
    canonical_answer,
    canonical_numbers,
    canonical_unicode,
    explicit_set,
    extract_answer,
    extract_boxed,
    normalize,
)

# --- extraction ------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{\left\{ 1, 2 \right\}}", r"\left\{ 1, 2 \right\}"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not counted
        (r"\boxed{\}}", r"\}"),
        ("no box here, the answer is 5", None),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{1} then \boxed{\frac{2}{3}", None),  # unbalanced last box: no fallback to an earlier one
        (r"\fbox{7}", "7"),
        (r"\boxed 5$ done", "5"),
        (r"\boxed {12}", "12"),
        (r"<answer>\boxed{42}</answer>", "42"),
        (r"\boxed{}", ""),
        (r"\boxedfoo{3}", None),
        ("", None),
        ("\\boxed{" * 5000, None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>hmm</think>\n<answer> 17 </answer>", "17"),
        ("<answer>1</answer> retry <answer>\n2\n</answer>", "2"),  # last block
        (r"<answer>the answer is \boxed{3}</answer>", "3"),  # box wins over the tag
        (r"\boxed{4} <answer>5</answer>", "4"),
        (r"\boxed{4 <answer>5</answer>", "5"),  # unbalanced box: tag fallback
        ("<answer>unterminated", None),
        ("just text", None),
        ("", None),
        ("<answer>12} {13</answer>", None),  # an answer is one balanced group (was graded as 12)
        ("<answer>\\{1, 2\\}</answer>", "\\{1, 2\\}"),  # escaped braces are literal
        ("<answer>a<answer> 7 </answer>", "7"),  # the last complete block
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "s, expected",
    [
        ("{}", True),
        ("\\frac{1}{2}", True),
        ("12} {13", False),
        ("{", False),
        ("\\{", True),
        ("\\\\{", False),
        ("", True),
    ],
)
def test_balanced(s, expected):
    assert balanced(s) is expected


# --- canonical Unicode: one row per character class, every member of the class -------------------

# The zero of every Unicode decimal-digit script (ASCII, Arabic-Indic, Extended Arabic-Indic, Devanagari, ...).
DIGIT_ZEROS = sorted(
    {cp - unicodedata.decimal(chr(cp)) for cp in range(0x110000) if unicodedata.decimal(chr(cp), None) is not None}
)
SUPERSCRIPTS = [chr(cp) for cp in range(0x110000) if unicodedata.decomposition(chr(cp)).startswith("<super>")]
SUBSCRIPTS = [chr(cp) for cp in range(0x110000) if unicodedata.decomposition(chr(cp)).startswith("<sub>")]
SUP_DIGITS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
SUB_DIGITS = "₀₁₂₃₄₅₆₇₈₉"
FORMAT_CHARS = [chr(cp) for cp in range(0x110000) if unicodedata.category(chr(cp)) == "Cf"]
FORMAT_WITH_MEANING = {"\u2061": "", "\u2062": "", "\u2063": ",", "\u2064": "+"}
SPACES = [chr(cp) for cp in range(0x110000) if unicodedata.category(chr(cp)) in ("Zs", "Zl", "Zp")]


def in_script(number: str, zero: int) -> str:
    return "".join(chr(zero + int(d)) if d.isdigit() else d for d in number)


def test_the_classes_are_what_the_issue_names():
    assert len(DIGIT_ZEROS) >= 60 and {0x30, 0x660, 0x6F0, 0x966} <= set(DIGIT_ZEROS)
    assert set(SUP_DIGITS + "⁺⁻⁼⁽⁾") <= set(SUPERSCRIPTS) and set(SUB_DIGITS + "₊₋₌₍₎") <= set(SUBSCRIPTS)
    assert {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"} <= set(FORMAT_CHARS)
    assert {"\u00a0", "\u2009", "\u202f", "\u3000"} <= set(SPACES)


@pytest.mark.parametrize("zero", DIGIT_ZEROS, ids=hex)
def test_every_decimal_digit_script_reads_as_ascii(zero):
    assert canonical_unicode(in_script("1234567890", zero)) == "1234567890"
    assert canonical_unicode(in_script("-3.5", zero)) == "-3.5"


def test_arabic_number_punctuation():
    assert canonical_unicode("٣٫٥") == "3.5"  # Arabic decimal separator
    assert canonical_answer("٣٬٠٠٠") == "3000"  # Arabic thousands separator
    assert canonical_unicode("٥٠٪") == "50%"
    assert canonical_unicode("١، ٢") == "1, 2"


@pytest.mark.parametrize("c", SUPERSCRIPTS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_superscript_stays_an_exponent(c):
    inner = unicodedata.normalize("NFKC", c).replace("\u2212", "-")
    assert canonical_unicode("10" + c) == "10^{" + inner + "}"
    assert canonical_unicode("x^" + c) == "x^{" + inner + "}"  # a caret already there is not doubled


@pytest.mark.parametrize("c", SUBSCRIPTS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_subscript_stays_a_subscript(c):
    inner = unicodedata.normalize("NFKC", c).replace("\u2212", "-")
    assert canonical_unicode("a" + c) == "a_{" + inner + "}"


@pytest.mark.parametrize(
    "s, expected",
    [
        ("10²", "10^{2}"),  # not 102
        ("2⁻¹", "2^{-1}"),  # not 2-1
        ("x²", "x^{2}"),  # not x2
        ("x²³", "x^{23}"),  # one exponent per run
        ("x⁽ⁿ⁺¹⁾", "x^{(n+1)}"),
        ("a₁₂", "a_{12}"),
        ("x₁²", "x_{1}^{2}"),
        ("e⁻ˣ", "e^{-x}"),
        ("5 ㎡", "5 m^{2}"),  # a superscript inside another compatibility character
        ("１２", "12"),  # fullwidth
        ("½", "1/2"),
        ("−3", "-3"),
        ("60°", "60^{\\circ}"),
        ("6∕4", "6/4"),
        ("\ue000x\ue002", "x"),  # private-use characters that would pass for the script markers
    ],
)
def test_canonical_unicode(s, expected):
    assert canonical_unicode(s) == expected


@pytest.mark.parametrize("c", FORMAT_CHARS, ids=lambda c: f"U+{ord(c):04X}")
def test_invisible_format_characters_are_dropped(c):
    assert canonical_unicode("1" + c + "2" + c) == "1" + FORMAT_WITH_MEANING.get(c, "") + "2" + FORMAT_WITH_MEANING.get(
        c, ""
    )


@pytest.mark.parametrize("c", SPACES, ids=lambda c: f"U+{ord(c):04X}")
def test_every_unicode_space_is_a_space(c):
    assert canonical_unicode("1" + c + "2") == "1 2"


def test_ascii_is_unchanged():
    ascii_text = "".join(map(chr, range(128)))
    assert canonical_unicode(ascii_text) == ascii_text


# --- canonical number notation ----------------------------------------------------------------------

SEPARATORS = [" ", "\u00a0", "\u2009", "\u202f", "\u2007", "\u3000", "\\,", "\\ ", "\\;", "\\:", "~"]


@pytest.mark.parametrize("sep", SEPARATORS, ids=repr)
def test_thousands_groups(sep):
    assert canonical_answer(f"1{sep}000") == "1000"
    assert canonical_answer(f"1{sep}000{sep}000") == "1000000"
    assert canonical_answer(f"-12{sep}345.5") == "-12345.5"
    assert canonical_answer(f"\\frac{{1{sep}000}}{{3}}") == "\\frac{1000}{3}"
    # Not a grouping: separate numbers, and a LaTeX space between them is a plain one.
    assert canonical_answer(f"1{sep}2") == "1 2"
    assert canonical_answer(f"10{sep}00") == "10 00"
    assert canonical_answer(f"1000{sep}000") == "1000 000"  # a first group of four
    assert canonical_answer(f"1{sep}0000") == "1 0000"
    assert canonical_answer(f"1{sep}000{sep}00") == "1 000 00"  # the whole run must be grouped
    assert canonical_answer(f"3.141{sep}592") == "3.141 592"  # only the integer part is grouped


@pytest.mark.parametrize(
    "s, expected",
    [
        ("1e3", "1000"),
        ("1E3", "1000"),
        ("1e+3", "1000"),
        ("1E+03", "1000"),
        ("1.0e3", "1000"),
        ("2.5e3", "2500"),
        ("0.1e4", "1000"),
        ("1.5e-2", "0.015"),
        ("1.5E-2", "0.015"),
        ("15e-3", "0.015"),
        ("-4.2e1", "-42"),
        ("1e0", "1"),
        ("1e100", "1\\times10^{100}"),  # long: stays a power of ten
        ("1.5e-40", "1.5\\times10^{-40}"),
        ("1e" + "9" * 5000, "1\\times10^{" + "9" * 5000 + "}"),
        ("x = 3e2", "x = 300"),
        ("(1e3, 2e3]", "(1000, 2000]"),
        ("2e", "2e"),  # 2 times e
        ("e3", "e3"),
        ("3e^{2}", "3e^{2}"),
        ("x2e3", "x2e3"),  # inside a word
        ("1e3.5", "1e3.5"),
        ("0x1e3", "0x1e3"),
    ],
)
def test_scientific_notation(s, expected):
    assert canonical_numbers(s) == expected


# --- explicit sets and the fast path's normalisation ---------------------------------------------------


@pytest.mark.parametrize(
    "s, expected",
    [
        ("\\{1,2\\}", True),
        ("\\left\\{ 1, 2 \\right\\}", True),
        ("\\lbrace 1,2 \\rbrace", True),
        ("$\\{1\\}$", True),
        ("\\{\\{1\\},2\\}", True),
        ("\\{1\\}\\cup\\{2\\}", False),
        ("(1,2)", False),
        ("1,2", False),
        ("\\{1", False),
        ("", False),
    ],
)
def test_explicit_set(s, expected):
    assert explicit_set(s) is expected


@pytest.mark.parametrize(
    "s, expected",
    [
        ("$5$", "5"),
        ("\\text{east}", "east"),
        ("\\text{a}+\\text{b}", "\\text{a}+\\text{b}"),
        ("1 + 2", "1+2"),
        ("1 2", "1 2"),  # a space between two word characters separates them
        ("\\left( 1, 2 \\right]", "(1,2]"),
        ("60^\\circ", "60"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("5.", "5"),
    ],
)
def test_normalize(s, expected):
    assert normalize(s) == expected


# --- linear time on raw model output ------------------------------------------------------------------

FUZZ_UNITS = [
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "\\boxed{",
    "\\boxed ",
    "{",
    "}",
    "\\",
    "^ ",
    " ",
    "$",
    "1",
    "\\fbox{",
    "000",
    "e3",
    "\\,",
    "\\{",
    "\\}",
    "²",
    "٣",
    "\u200b",
]


@functools.cache
def fuzz_texts(n: int) -> list[str]:
    """Degenerate model output of about n characters: each unit repeated, random mixes, nesting,
    and the inputs that make each canonicalisation step work hardest."""
    rng = random.Random(n)
    texts = [unit * (n // len(unit)) for unit in FUZZ_UNITS]  # one tag repeated
    texts += ["".join(rng.choice(FUZZ_UNITS) for _ in range(n // 4))[:n] for _ in range(4)]  # mixes
    texts += ["<answer>" * (n // 16) + "</answer>" * (n // 18), "\\boxed{" + "{" * (n // 2) + "}" * (n // 2)]
    texts += ["1 " * (n // 2), "1 000 " * (n // 6), "1e3 " * (n // 4), "9" * n + "e5"]
    texts += ["".join(chr(rng.randrange(0x110000)) for _ in range(n // 4))]  # every kind of character
    return texts


@pytest.mark.parametrize("n", [1_000, 100_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
def test_everything_that_reads_model_output_is_linear(n):
    """Degenerate repetition (the R1 template's `<answer>` * 16000 took 7.8 s before) costs linear time:
    1M characters of any mix of tags, braces, digits, spaces and scripts are read within a fixed budget."""
    texts = fuzz_texts(n)
    t0 = time.perf_counter()
    for text in texts:
        extract_answer(text)
        balanced(text)
        normalize(canonical_answer(text))
        explicit_set(text)
    per_char = (time.perf_counter() - t0) / sum(map(len, texts))
    assert per_char < 2e-6, f"{per_char * 1e6:.2f} us per character"  # linear: ~0.3 us; quadratic: seconds
