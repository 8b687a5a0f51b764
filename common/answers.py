"""The final answer of a completion (its last \\boxed{...}, else its last <answer>...</answer>), its canonical
form, the light normalisation of the exact-match fast path, and math-verify's parse of an answer (symbolic
equivalence is `common.verifier`'s, which runs math-verify in child processes).
Everything runs on raw model output (up to a megabyte of repetition), so each function is one linear scan with
no regex that can backtrack over model text (tests/test_answers.py fuzzes them up to 1M characters).
"""

import re
import unicodedata
from itertools import accumulate

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")  # not `\boxedfoo`
_ESCAPED_RE = re.compile(r"\\.", re.DOTALL)
_NOT_BRACE_RE = re.compile(r"[^{}]+")
_DEPTH = {"{": 1, "}": -1}


def _closing_brace(text: str, open_idx: int) -> int | None:
    """Index of the `}` closing the `{` at text[open_idx], or None. A backslash escapes the next character:
    `\\{` (a literal brace) is not counted, `\\\\{` (line break, then a group) is."""
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
    """Do the (unescaped) braces of s pair up? Then wrapping it in `\\boxed{...}` cannot let a brace escape
    the box (`12} {13`)."""
    if "{" not in s and "}" not in s:
        return True
    braces = _NOT_BRACE_RE.sub("", _ESCAPED_RE.sub("", s))
    return braces.count("{") == braces.count("}") and min(accumulate(map(_DEPTH.__getitem__, braces)), default=0) >= 0


def extract_boxed(text: str) -> str | None:
    """Content of the LAST \\boxed{...} (or \\fbox{...}, or `\\boxed 5`), nested braces included; None if
    there is none or its braces do not close (a truncated final answer is no answer: no earlier box)."""
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
    end = i  # `\boxed 5`: the next run of non-space, non-`$` characters
    while end < len(text) and not text[end].isspace() and text[end] != "$":
        end += 1
    return text[i:end] or None


def extract_answer(text: str) -> str | None:
    """The model's final answer: the last box, else the stripped content of the last complete
    <answer>...</answer> (R1 template); None if neither, or if its braces do not pair up."""
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


# Canonical form (`canonical_unicode`): NFKC would fold scripts ("10²" -> "102"), so they are marked first.
# Each step is one `str.translate` whose table fills itself per distinct character: linear.
_SUP, _SUB, _SUP_END, _SUB_END = "\ue000", "\ue001", "\ue002", "\ue003"  # private use: dropped from input
_MARKERS = (_SUP, _SUB, _SUP_END, _SUB_END)
# Format characters (Cf) that mean something (function application, invisible times, separator, plus);
# the rest (zero-width, BOM, soft hyphen, direction marks) are dropped.
_FORMAT_MEANING = {"\u2061": "", "\u2062": "", "\u2063": ",", "\u2064": "+"}
# After NFKC: fraction slash, minus, division slash, degree; Arabic decimal point, thousands, comma, percent.
_AFTER_NFKC = {
    "\u2044": "/", "\u2212": "-", "\u2215": "/", "\u00b0": "^{\\circ}",
    "\u066b": ".", "\u066c": " ", "\u060c": ",", "\u066a": "%",
}  # fmt: skip


def _script_runs(c: str) -> str | None:
    """c with its superscript/subscript parts marked, or None if it has none: "²" is one (<super>), "㎡"
    holds one ("m" + marked "2")."""
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
    """The ASCII-leaning form of s that math-verify parses, meaning unchanged: NFKC, but a script run stays
    a script ("10²" -> "10^{2}", "x₁" -> "x_{1}"), any decimal digit ASCII ("٣٫٥" -> "3.5"), any space " ",
    invisible format characters dropped, minus/slashes/degree as "-", "/", "^{\\circ}"."""
    if s.isascii():
        return s
    s = unicodedata.normalize("NFKC", s.translate(_BEFORE_NFKC)).translate(_AFTER_NFKC_TABLE)
    if _SUP in s or _SUB in s:
        s = s.replace(_SUP_END + _SUP, "").replace(_SUB_END + _SUB, "")  # one script per run: "x²³" -> x^{23}
        s = s.replace("^" + _SUP, _SUP).replace("_" + _SUB, _SUB)  # "x^²" is x^{2} too
        s = s.replace(_SUP, "^{").replace(_SUB, "_{").replace(_SUP_END, "}").replace(_SUB_END, "}")
    return s


# Digit groups separated by a space or a LaTeX space. Each pattern starts with what it matches first (the
# search skips ahead in C), then looks behind so a match starts only at a run's first digit, and possessive
# quantifiers never give back: each run is read once.
_SEPARATOR = r"(?: |~|\\[,;: ])"
_DIGIT_GROUPS_RE = re.compile(r"\d(?<![\d.]\d)\d*+(?:" + _SEPARATOR + r"\d++)++")
_SEPARATOR_RE = re.compile(_SEPARATOR)
_LATEX_SPACE_BETWEEN_DIGITS_RE = re.compile(r"(?:~(?<=\d~)|\\[,;: ](?<=\d\\[,;: ]))(?=\d)")
_SCIENTIFIC_RE = re.compile(r"(\d(?<![\w.]\d)\d*+)(?:\.(\d++))?+[eE]([+-]?+)(\d++)(?![\w.])")  # 1e3, 1.5E-2
_MAX_PLAIN_EXPONENT = 30  # beyond it, m\times10^{e}


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
    """Numbers in one notation: thousands joined ("1 000", "1\\,000" -> "1000"; "1 2", "10 00" stay two
    numbers) and scientific notation as a decimal ("1.5e-2" -> "0.015"; "1e100" -> "1\\times10^{100}")."""
    s = _DIGIT_GROUPS_RE.sub(_digit_groups, s)
    s = _LATEX_SPACE_BETWEEN_DIGITS_RE.sub(" ", s)  # the ones left (after a decimal point) separate too
    return _SCIENTIFIC_RE.sub(_scientific, s) if "e" in s or "E" in s else s


def canonical_answer(s: str) -> str:
    """What both answers become before any comparison."""
    return canonical_numbers(canonical_unicode(s))


_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*(?=\{)")
# `(?![A-Za-z])` keeps `\rightarrow`; the degree sign's `\s*(?:\{\s*)?` matches spaces one way only.
_DROP_RE = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[!,;:]|\^\s*(?:\{\s*)?\\circ\s*\}?")
_SPACE_RE = re.compile(r"\s+")
_LAYOUT_SPACE_RE = re.compile(r" (?!(?<=\w )\w)")  # a space between word characters separates ("1 2")


def normalize(s: str) -> str:
    """Light normalisation for the exact-match fast path, which skips the child process when two answers
    are textually the same (not a semantic check)."""
    s = s.strip().strip("$").strip()
    m = _TEXT_WRAPPER_RE.match(s)  # a whole-answer `\text{...}`, not `\text{a}+\text{b}`
    if m and _closing_brace(s, m.end()) == len(s) - 1:
        s = s[m.end() + 1 : -1]
    s = _DROP_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LAYOUT_SPACE_RE.sub("", _SPACE_RE.sub(" ", s).strip())
    return s.rstrip(".")


def explicit_set(s: str) -> bool:
    """Is s one set in set braces (`\\{...\\}`, `\\left\\{...\\right\\}`, `\\lbrace...\\rbrace`)? It never
    equals an interval or a tuple, however math-verify would pair up their elements."""
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


def math_verify_parse(s: str, parse) -> list:
    """math-verify's parse of an answer, wrapped in \\boxed{} (if balanced, so no brace closes it early) so
    that its LaTeX extractor takes the whole string (bare "(1,2]" is not recognised); else plain text."""
    s = s.strip().strip("$").strip()
    wrapped = parse("\\boxed{" + s + "}", parsing_timeout=None) if balanced(s) else None
    return wrapped or parse(s, parsing_timeout=None)


def set_against_ordered(gold: str, gold_parsed: list, pred: str, pred_parsed: list) -> bool:
    """Is one answer a set in set braces and the other an interval or a tuple? Never equal, though
    math-verify pairs them up ("(1,2)" = {1,2}, and sorting a tuple, "(2,1)" = {1,2})."""
    from sympy import FiniteSet, Interval, Tuple

    def shape(text: str, parsed: list) -> str | None:
        first = parsed[0] if parsed else None
        if isinstance(first, (Interval, Tuple)):
            return "ordered"
        if isinstance(first, FiniteSet) and explicit_set(text):
            return "set"
        return None

    return {shape(gold, gold_parsed), shape(pred, pred_parsed)} == {"set", "ordered"}
