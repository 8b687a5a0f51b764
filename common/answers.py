"""Reading a model's final answer, its canonical form, and the light normalisation that settles most
comparisons.

The final answer is the last \\boxed{...} of a completion (or, without a box, its last
<answer>...</answer> block). Both answers are made canonical before any comparison
(`canonical_answer`: Unicode digits, scripts and spaces; number notation), then compared as
normalised text (`normalize`). Everything here runs in the trainer on raw model output, which
can be a megabyte of degenerate repetition: every function is a single linear scan (no regex
that can backtrack over model text); tests/test_answers.py fuzzes them up to 1M characters.
Symbolic equivalence (sympy) is `common.verifier`'s job.
"""

import re
import unicodedata
from itertools import accumulate

# `(?![A-Za-z])` so that e.g. `\boxedfoo` is not taken for a box.
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


# For `balanced`: an escaped character (`\{`, `\\`), and anything but a brace.
_ESCAPED_RE = re.compile(r"\\.", re.DOTALL)
_NOT_BRACE_RE = re.compile(r"[^{}]+")
_DEPTH = {"{": 1, "}": -1}


def _closing_brace(text: str, open_idx: int) -> int | None:
    """Index of the `}` closing the `{` at text[open_idx], or None if unbalanced.

    A backslash escapes the next character, so `\\{`/`\\}` (literal braces in a
    set) are not counted and `\\\\{` (line break, then a group) is.
    """
    depth, i = 0, open_idx
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def balanced(s: str) -> bool:
    """Do the (unescaped) braces of s pair up? An answer must be one balanced group, so that
    wrapping it in `\\boxed{...}` cannot let a brace escape the box (`12} {13`)."""
    if "{" not in s and "}" not in s:
        return True
    braces = _NOT_BRACE_RE.sub("", _ESCAPED_RE.sub("", s))  # a backslash escapes the next character
    return braces.count("{") == braces.count("}") and min(accumulate(map(_DEPTH.__getitem__, braces)), default=0) >= 0


def extract_boxed(text: str) -> str | None:
    """Content of the LAST \\boxed{...} (also \\fbox{...} and the `\\boxed 5` space form) in text.

    Nested braces are handled (\\boxed{\\frac{1}{2}} -> "\\frac{1}{2}"). None if there
    is no box or the last box's braces are unbalanced (we do not fall back to an
    earlier box: a truncated final answer is no answer).
    """
    if not isinstance(text, str):
        return None
    last = None
    for last in _BOX_RE.finditer(text):  # noqa: B007 - only the last match is wanted
        pass
    if last is None:
        return None
    i = last.end()
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == "{":
        close = _closing_brace(text, i)
        return None if close is None else text[i + 1 : close]
    # `\boxed 5`: the argument is the next run of non-space, non-`$` characters.
    end = i
    while end < len(text) and not text[end].isspace() and text[end] != "$":
        end += 1
    return text[i:end] or None


def extract_answer(text: str) -> str | None:
    """The model's final answer.

    The last boxed content; if there is none (or it is unbalanced), the stripped
    content of the last complete <answer>...</answer> block (R1-style template):
    the text between the last `</answer>` and the last `<answer>` before it. An
    answer whose braces do not pair up is no answer. Else None.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed if balanced(boxed) else None
    if not isinstance(text, str):
        return None
    close = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, close) if close >= 0 else -1
    if start < 0:
        return None
    answer = text[start + len("<answer>") : close].strip()
    return answer if balanced(answer) else None


# ---------------------------------------------------------------------------
# Canonical form: what both answers become before any comparison
# ---------------------------------------------------------------------------
# NFKC folds compatibility characters into the form math-verify parses (fullwidth digits,
# "½" -> "1⁄2", ligatures, every Unicode space -> " "), but it also folds superscripts and
# subscripts into plain text ("10²" -> "102", "2⁻¹" -> "2-1"): those become LaTeX scripts
# first. It leaves other scripts' decimal digits ("٣") and invisible format characters (zero-width
# space, BOM) alone: those become ASCII digits and are dropped. Each step is one `str.translate`
# pass whose table fills itself per distinct character, so the cost stays linear.

# Private-use markers for a superscript/subscript run while NFKC runs (any in the input are dropped).
_SUP, _SUB, _SUP_END, _SUB_END = "\ue000", "\ue001", "\ue002", "\ue003"
_MARKERS = (_SUP, _SUB, _SUP_END, _SUB_END)
# Format characters (category Cf) that stand for something: the rest (zero-width space and joiners,
# word joiner, BOM, soft hyphen, direction marks) are dropped.
_FORMAT_MEANING = {
    "\u2061": "",  # function application
    "\u2062": "",  # invisible times
    "\u2063": ",",  # invisible separator
    "\u2064": "+",  # invisible plus
}
# After NFKC: the fraction slash of "½" -> "1⁄2", the minus sign, the division slash, the degree
# sign, and the Arabic decimal point, thousands separator, comma and percent sign.
_AFTER_NFKC = {
    "\u2044": "/",
    "\u2212": "-",
    "\u2215": "/",
    "\u00b0": "^{\\circ}",
    "\u066b": ".",
    "\u066c": " ",
    "\u060c": ",",
    "\u066a": "%",
}


def _script_runs(c: str) -> str | None:
    """c with its superscript/subscript parts marked (NFKC-folded inside the markers), or None if it
    has none. A character is one (its compatibility decomposition is <super>/<sub>: "²", "⁻", "ⁿ",
    "₂") or holds one in its decomposition ("㎡" -> "m" + marked "2")."""
    decomposition = unicodedata.decomposition(c)
    if not decomposition.startswith("<"):
        return None
    tag, *parts = decomposition.split()
    if tag in ("<super>", "<sub>"):
        opening, closing = (_SUP, _SUP_END) if tag == "<super>" else (_SUB, _SUB_END)
        return opening + unicodedata.normalize("NFKC", c) + closing
    folded = [_script_runs(chr(int(part, 16))) for part in parts]
    if all(f is None for f in folded):
        return None
    return "".join(chr(int(p, 16)) if f is None else f for p, f in zip(parts, folded))


class _BeforeNFKC(dict):
    """str.translate table, filled on first sight of each character: markers in the input and format
    characters dropped (or their meaning), superscript/subscript parts marked."""

    def __missing__(self, code: int):
        c = chr(code)
        if c in _MARKERS:
            out = ""
        elif unicodedata.category(c) == "Cf":
            out = _FORMAT_MEANING.get(c, "")
        else:
            out = _script_runs(c)
        if len(self) < 1 << 16:  # a text of every code point cannot grow the table without bound
            self[code] = code if out is None else out
        return code if out is None else out


class _AfterNFKC(dict):
    """str.translate table: every Unicode decimal digit (Arabic-Indic, Devanagari, ...) as ASCII, every
    space as " ", and the symbols of `_AFTER_NFKC`."""

    def __missing__(self, code: int):
        c = chr(code)
        digit = unicodedata.decimal(c, None)
        if digit is not None:
            out = str(digit)
        elif unicodedata.category(c) in ("Zs", "Zl", "Zp"):  # the spaces NFKC leaves (U+1680, line separator)
            out = " "
        else:
            out = _AFTER_NFKC.get(c, code)
        if len(self) < 1 << 16:
            self[code] = out
        return out


_BEFORE_NFKC = _BeforeNFKC()
_AFTER_NFKC_TABLE = _AfterNFKC()


def canonical_unicode(s: str) -> str:
    """The ASCII-leaning form of s that math-verify parses, without changing what it means.

    NFKC (fullwidth digits -> ASCII, "½" -> "1/2", ligatures), except that a run of superscripts or
    subscripts stays a script: "10²" -> "10^{2}", "2⁻¹" -> "2^{-1}", "x₁" -> "x_{1}". Every Unicode
    decimal digit becomes its ASCII digit ("٣٫٥" -> "3.5") and every space " "; zero-width and
    other invisible format characters (U+200B..U+200D, U+2060, BOM) are dropped; the minus sign,
    fraction and division slashes and degree sign become "-", "/", "/" and "^{\\circ}".
    """
    if s.isascii():
        return s
    s = unicodedata.normalize("NFKC", s.translate(_BEFORE_NFKC)).translate(_AFTER_NFKC_TABLE)
    if _SUP in s or _SUB in s:
        s = s.replace(_SUP_END + _SUP, "").replace(_SUB_END + _SUB, "")  # one script per run: "x²³" -> x^{23}
        s = s.replace("^" + _SUP, _SUP).replace("_" + _SUB, _SUB)  # "x^²" is x^{2} too
        s = s.replace(_SUP, "^{").replace(_SUB, "_{").replace(_SUP_END, "}").replace(_SUB_END, "}")
    return s


# Number notation: digit groups separated by a space (any Unicode space is one after NFKC) or a
# LaTeX space (`\,` `\;` `\:` `\ ` `~`). Each pattern starts with what it matches first (so the
# search skips ahead in C) and then looks behind: a match starts only at the first digit of a run,
# and the possessive quantifiers never give back, so each run is read once: linear time.
_SEPARATOR = r"(?: |~|\\[,;: ])"
_DIGIT_GROUPS_RE = re.compile(r"\d(?<![\d.]\d)\d*+(?:" + _SEPARATOR + r"\d++)++")
_SEPARATOR_RE = re.compile(_SEPARATOR)
_LATEX_SPACE_BETWEEN_DIGITS_RE = re.compile(r"(?:~(?<=\d~)|\\[,;: ](?<=\d\\[,;: ]))(?=\d)")
# Scientific notation: 1e3, 1E+3, 1.5e-2 (not inside a word or a longer number).
_SCIENTIFIC_RE = re.compile(r"(\d(?<![\w.]\d)\d*+)(?:\.(\d++))?+[eE]([+-]?+)(\d++)(?![\w.])")
# A scientific number whose plain decimal form would be longer is written as m\times10^{e} instead.
_MAX_PLAIN_EXPONENT = 30


def _digit_groups(m: re.Match) -> str:
    groups = _SEPARATOR_RE.split(m.group())
    if len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:]):
        return "".join(groups)  # thousands: "1 000 000" -> "1000000"
    return " ".join(groups)  # separate numbers ("1 2", "10 00"), a LaTeX space as a plain one


def _scientific(m: re.Match) -> str:
    whole, decimals, sign, exponent = m.group(1), m.group(2) or "", m.group(3), m.group(4)
    if len(exponent) > 2 or int(exponent) > _MAX_PLAIN_EXPONENT:
        mantissa = whole + ("." + decimals if decimals else "")
        return f"{mantissa}\\times10^{{{'-' if sign == '-' else ''}{exponent.lstrip('0') or '0'}}}"
    digits = whole + decimals
    point = len(whole) + (-int(exponent) if sign == "-" else int(exponent))  # where the decimal point goes
    if point <= 0:
        digits, point = "0" * (1 - point) + digits, 1
    digits += "0" * (point - len(digits))
    integer, fraction = digits[:point].lstrip("0") or "0", digits[point:].rstrip("0")
    return integer + ("." + fraction if fraction else "")


def canonical_numbers(s: str) -> str:
    """Numbers in one notation: thousands grouped by spaces joined ("1 000" and "1\\,000" -> "1000";
    only groups of exactly three digits after a first group of one to three, so "1 2" and "10 00"
    stay two numbers, a LaTeX space between them made a plain one) and scientific notation as a plain
    decimal ("1e3" -> "1000", "1.5e-2" -> "0.015"; "1e100" -> "1\\times10^{100}")."""
    s = _DIGIT_GROUPS_RE.sub(_digit_groups, s)
    s = _LATEX_SPACE_BETWEEN_DIGITS_RE.sub(" ", s)  # the ones left (after a decimal point) separate too
    return _SCIENTIFIC_RE.sub(_scientific, s) if "e" in s or "E" in s else s


def canonical_answer(s: str) -> str:
    """`canonical_numbers(canonical_unicode(s))`: what both answers become before any comparison."""
    return canonical_numbers(canonical_unicode(s))


# ---------------------------------------------------------------------------
# Exact-match fast path
# ---------------------------------------------------------------------------

_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*(?=\{)")
# `(?![A-Za-z])` keeps `\rightarrow`, `\leftarrow` intact. In the degree sign, `\s*(?:\{\s*)?`
# has one way to match a run of spaces (two `\s*` side by side would backtrack quadratically).
_DROP_RE = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[!,;:]|\^\s*(?:\{\s*)?\\circ\s*\}?")
_SPACE_RE = re.compile(r"\s+")
# A space between two word characters separates them ("1 2" is not "12"); elsewhere it is layout.
_LAYOUT_SPACE_RE = re.compile(r" (?!(?<=\w )\w)")


def normalize(s: str) -> str:
    """Light normalisation for the exact-match fast path (not a semantic check).

    Only used to skip the child process when two answers are textually the
    same; anything cleverer is math-verify's job. Spaces are dropped except
    between two word characters, which they keep apart.
    """
    s = s.strip().strip("$").strip()
    # A whole-answer `\text{...}` wrapper ("\text{east}" -> "east"); only when its
    # brace closes at the very end, so `\text{a}+\text{b}` is left alone.
    m = _TEXT_WRAPPER_RE.match(s)
    if m and _closing_brace(s, m.end()) == len(s) - 1:
        s = s[m.end() + 1 : -1]
    s = _DROP_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LAYOUT_SPACE_RE.sub("", _SPACE_RE.sub(" ", s).strip())
    return s.rstrip(".")


# ---------------------------------------------------------------------------
# Answer shapes
# ---------------------------------------------------------------------------


def explicit_set(s: str) -> bool:
    """Is s one set written in set braces, `\\{...\\}` (or `\\left\\{ ... \\right\\}`, `\\lbrace ... \\rbrace`)?
    Such an answer never equals an interval or a tuple, however math-verify would pair up their elements."""
    if "\\{" not in s and "\\lbrace" not in s:
        return False
    t = normalize(s).replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    if not (t.startswith("\\{") and t.endswith("\\}")):
        return False
    depth, i = 0, 0
    while i < len(t):
        if t[i] == "\\":
            if t.startswith("\\{", i):
                depth += 1
            elif t.startswith("\\}", i):
                depth -= 1
                if depth == 0:
                    return i + 2 == len(t)  # the first set closes at the very end: one set
            i += 2
            continue
        i += 1
    return False
