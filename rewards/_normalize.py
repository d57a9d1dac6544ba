"""String-level normalisation of math answers.

The rules follow the answer normalisation of Hendrycks et al. 2021 (MATH,
arXiv:2103.03874, ``is_equiv``/``strip_string``) and Lewkowycz et al. 2022
(Minerva, arXiv:2206.14858, Appendix D.1 ``normalize_final_answer``): drop
display styling (``\\left``/``\\right``, ``\\dfrac``/``\\tfrac``, spacing),
units written as ``\\text{...}``, degrees, dollar signs and sentence
punctuation, so that ``\\dfrac{1}{2}\\text{ cm}`` and ``\\frac12`` compare
equal as strings.  Everything here is plain ``str`` work: linear in the input
length, no regex backtracking on model text (all patterns are anchored on
literal prefixes).
"""

from __future__ import annotations

import re
import unicodedata

MAX_RESPONSE_CHARS = 200_000  # longer responses are judged on their tail
MAX_ANSWER_CHARS = 1_000  # an extracted answer longer than this is not parsed

_SURROGATES = re.compile("[\ud800-\udfff]")


def sanitize(text: object, limit: int = MAX_RESPONSE_CHARS) -> str:
    """Make any model output safe to scan: a ``str`` without NULs or lone surrogates.

    Long inputs keep their *tail*, where final answers live.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    if len(text) > limit:
        text = text[-limit:]
    if "\x00" in text:
        text = text.replace("\x00", "")
    return _SURROGATES.sub("", text)


# Styling with no mathematical meaning (Hendrycks strip_string; Minerva's REMOVED_EXPRESSIONS).
_DROP = (
    "\\displaystyle", "\\textstyle", "\\scriptstyle", "\\limits", "\\nolimits",
    "\\bigl", "\\bigr", "\\Bigl", "\\Bigr", "\\biggl", "\\biggr", "\\big", "\\Big", "\\bigg", "\\Bigg",
    "\\!", "\\mathstrut", "\\strut",
)
_SPACES = ("\\qquad", "\\quad", "\\,", "\\;", "\\:", "\\ ", "~", "\\>", "\\enspace", "\\thinspace")
_DEGREES = ("^{\\circ}", "^\\circ", "^{\\circ }", "{}^\\circ", "\\circ", "°", "\\degree", "^{°}", "^°")
_FRACS = (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\cfrac", "\\frac"), ("\\dbinom", "\\binom"),
          ("\\tbinom", "\\binom"))
_RELS = (("\\leqslant", "\\le"), ("\\geqslant", "\\ge"), ("\\leq", "\\le"), ("\\geq", "\\ge"),
         ("≤", "\\le"), ("≥", "\\ge"), ("≠", "\\ne"), ("\\neq", "\\ne"), ("−", "-"), ("×", "\\times"),
         ("÷", "\\div"), ("·", "\\cdot"), ("π", "\\pi"), ("∞", "\\infty"), ("√", "\\sqrt"))

_THOUSANDS_BRACE = re.compile(r"(\d) ?\{ ?, ?\} ?(?=\d{3})")
_DOUBLED_BACKSLASH = re.compile(r"\\{2,}(?=[a-zA-Z])")
# "1000,99" and "0,111" can only be decimal commas; "1,22" or "-2,1" stay lists (MATH answers).
_DECIMAL_COMMA = re.compile(r"-?(?:0|\d{4,}),\d+|-?\d{1,3},\d{4,}")
_THOUSANDS_BANG = re.compile(r"(\d),\\!\s?(?=\d{3})")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)\s*(\\[{}|]|\\[lr]?[vV]ert|\\langle|\\rangle|[()\[\].|])")


def clean_latex(ans: str) -> str:
    """Remove presentation-only LaTeX from an extracted answer (keeps its meaning).

    Applied to a fixpoint (at most a few passes), so it is idempotent: rules
    can uncover text another rule would rewrite ("\\\\%" -> "\\%" -> "%").
    """
    s = ans
    for _ in range(6):
        cleaned = _clean_once(s)
        if cleaned == s:
            break
        s = cleaned
    return s


def _clean_once(ans: str) -> str:
    s = unicodedata.normalize("NFKC", ans) if not ans.isascii() else ans
    s = s.strip()
    s = _strip_math_delimiters(s)
    s = _THOUSANDS_BRACE.sub(r"\1", s)
    if "\\\\" in s and "\\begin" not in s:  # "\\\\frac" typed for "\\frac" (Hendrycks collapses these)
        s = _DOUBLED_BACKSLASH.sub(lambda _: "\\", s)
    if "," in s and _DECIMAL_COMMA.fullmatch(s.strip()):  # a lone "1000,99" / "0,111" is a decimal comma
        s = s.replace(",", ".")
    s = _THOUSANDS_BANG.sub(r"\1", s)
    s = _LEFT_RIGHT.sub(lambda m: "" if m.group(1) == "." else m.group(1), s)
    for a, b in _FRACS + _RELS:
        if a in s:
            s = s.replace(a, b)
    for tok in _DROP:
        if tok in s:
            s = s.replace(tok, "")
    s = s.replace("\\\\", "\x01")  # protect the row separator "\\" from "\ " below
    for tok in _SPACES:
        if tok in s:
            s = s.replace(tok, " ")
    s = s.replace("\x01", "\\\\")
    for tok in _DEGREES:
        if tok in s:
            s = s.replace(tok, "")
    s = s.replace("\\%", "%").replace("\\$", "").replace("$", "")
    s = s.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    s = _strip_sentence_punct(s.strip())
    # Removals can leave a base letter next to a combining mark ("H{}\u0308"): recompose,
    # so the next pass sees what this one produced and the fixpoint is stable.
    return unicodedata.normalize("NFKC", s) if not s.isascii() else s


def _strip_math_delimiters(s: str) -> str:
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left): len(s) - len(right)].strip()
    return s


def _strip_sentence_punct(s: str) -> str:
    """A final '.' or ',' closes the sentence, not the answer ("$\\frac13.$")."""
    while s and s[-1] in ".,;" and not s.endswith("..."):
        if s[-1] == "." and len(s) >= 2 and s[-2] == "\\":  # "\." is not punctuation
            break
        s = s[:-1].rstrip()
    return s


_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mbox|mathit|operatorname)\s*\{([^{}]*)\}")


def canonical_string(ans: str) -> str:
    """The layer-1 comparison key: cleaned LaTeX, ``\\text{}`` unwrapped, no whitespace.

    Repeated to a fixpoint (unwrapping can expose text the cleaner rewrites), so the
    key of a key is the key itself.
    """
    s = ans
    for _ in range(8):
        key = _canonical_once(s)
        if key == s:
            break
        s = key
    return s


def _canonical_once(ans: str) -> str:
    s = clean_latex(ans)
    s = _TEXT_CMD.sub(r"\1", s)
    s = "".join(s.split())
    if s.startswith("\\boxed{") and s.endswith("}"):
        s = s[7:-1]
    return s
