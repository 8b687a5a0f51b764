"""Reading a model's final answer, and the light normalisation that settles most comparisons.

The final answer is the last \\boxed{...} of a completion (or, without a box, its last
<answer>...</answer> block). Everything here runs in the trainer on raw model output, which
can be a megabyte of degenerate repetition: every function is a single linear scan (no regex
that can backtrack over model text); tests/test_answers.py fuzzes them up to 1M characters.
Symbolic equivalence (sympy) is `common.verifier`'s job.
"""

import re
import unicodedata

# `(?![A-Za-z])` so that e.g. `\boxedfoo` is not taken for a box.
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


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
    depth, i = 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
        i += 1
    return depth == 0


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
# Exact-match fast path
# ---------------------------------------------------------------------------

_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*(?=\{)")
# `(?![A-Za-z])` keeps `\rightarrow`, `\leftarrow` intact. In the degree sign, `\s*(?:\{\s*)?`
# has one way to match a run of spaces (two `\s*` side by side would backtrack quadratically).
_DROP_RE = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[!,;:]|\^\s*(?:\{\s*)?\\circ\s*\}?")
_SPACE_RE = re.compile(r"\s+")
# A space between two word characters separates them ("1 2" is not "12"); elsewhere it is layout.
_LAYOUT_SPACE_RE = re.compile(r" (?!(?<=\w )\w)")
# After NFKC: the fraction slash of "½" -> "1⁄2", and the minus sign, as ASCII.
_UNICODE_MATH = str.maketrans({"\u2044": "/", "\u2212": "-"})


def canonical_unicode(s: str) -> str:
    """NFKC (fullwidth digits -> ASCII, "½" -> "1⁄2", ligatures) and ASCII fraction slash and
    minus: the form math-verify parses. Applied to both answers before any comparison."""
    return unicodedata.normalize("NFKC", s).translate(_UNICODE_MATH)


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
