"""Finding the final answer in a model response.

Rules, tried in order (the first that finds something wins):

* ``boxed``: the last ``\\boxed{...}`` / ``\\fbox{...}`` with brace matching
  (Hendrycks et al. 2021 ``last_boxed_only_string``); boxes right before it,
  separated only by "and"/commas, join it (``\\boxed{-2} and \\boxed{1}``);
* ``final_answer``: Minerva's "Final Answer: The final answer is X. I hope it
  is correct." (Lewkowycz et al. 2022, Appendix D.1);
* ``answer_tag``: ``<answer>X</answer>``;
* ``answer_is``: "the answer is X", "Answer: X";
* ``hashes``: GSM8K's ``#### X``;
* ``last_math`` / ``last_number``: fallbacks (flexible mode only).

``boxed_run`` reads boxes spread over a sentence with a looser rule
(``\\boxed{3} and later \\boxed{5}``); the math checker tries it only as a second
reading against a gold that is a list or set.

All scans use ``str.rfind`` and bounded slices, so they are linear in the
response length whatever the response contains.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Extraction(NamedTuple):
    text: str
    rule: str


_BOX_CMDS = ("\\boxed", "\\fbox")
# Only "and"/commas join boxes: "\boxed{a} or \boxed{b}" restates (or hedges) one answer.
_JOINERS = re.compile(r"^(?:\s|\$|,|;|\\quad|\\qquad|\\text\{\s*(?:and|,)\s*\}|and|\\\(|\\\)|\\\[|\\\])*$")
MAX_TAIL = 4_000  # answer markers are searched for in this many final characters
MAX_BOX_CHARS = MAX_TAIL  # a box's brace group is looked for this far; longer reads as unclosed
MAX_UNCLOSED = 16  # unclosed "\\boxed{" starts skipped before giving up on boxes


def _brace_end(text: str, open_at: int) -> int:
    """Index just past the brace group opening at ``open_at``; -1 when unbalanced
    (or not closed within ``MAX_BOX_CHARS``: each call costs at most that much)."""
    depth = 0
    for k in range(open_at, min(len(text), open_at + MAX_BOX_CHARS)):
        c = text[k]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return k + 1
        elif c == "\\" and k + 1 < len(text) and text[k + 1] in "{}":
            continue
    return -1


def _box_at(text: str, start: int) -> tuple[str, int] | None:
    """Content and end of the box command starting at ``start``."""
    stop = min(len(text), start + MAX_BOX_CHARS)
    j = start + 1
    while j < stop and text[j].isalpha():
        j += 1
    while j < stop and text[j] == " ":
        j += 1
    if j < stop and text[j] == "{":
        end = _brace_end(text, j)
        if end < 0:
            return None
        return text[j + 1: end - 1], end
    # "\boxed 5": one token up to whitespace or "$"
    k = j
    while k < stop and not text[k].isspace() and text[k] not in "$":
        k += 1
    return (text[j:k], k) if k > j else None


def _last_box_start(text: str, before: int) -> int:
    return max(text.rfind(cmd, 0, before) for cmd in _BOX_CMDS)


def _last_closed_box(text: str) -> tuple[int, tuple[str, int]] | None:
    """Start and (content, end) of the last closed box; skips at most ``MAX_UNCLOSED`` unclosed
    starts ("\\boxed{" repeated thousands of times must not cost a scan per start)."""
    start = _last_box_start(text, len(text))
    for _ in range(MAX_UNCLOSED + 1):
        if start < 0:
            return None
        box = _box_at(text, start)
        if box is not None:
            return start, box
        start = _last_box_start(text, start)
    return None


def last_boxed(text: str) -> str | None:
    found = _last_closed_box(text)
    if found is None:
        return None
    start, box = found
    answers = [box[0]]
    # Join earlier boxes separated only by connectives: "\boxed{-2} and \boxed{1}".
    for _ in range(16):
        prev = _last_box_start(text, start)
        if prev < 0 or start - prev > 400:
            break
        prev_box = _box_at(text, prev)
        if prev_box is None or prev_box[1] > start or not _JOINERS.match(text[prev_box[1]: start]):
            break
        answers.insert(0, prev_box[0])
        start = prev
    return ", ".join(a.strip() for a in answers)


# Boxes that state one answer together: joined by a comma, ";" or "and", with at most a short
# label or phrase on one side of the joiner ("\\boxed{3} for part (a) and \\boxed{1}",
# "$x = \\boxed{3}$, and $y = \\boxed{5}$"), or by nothing but spacing.  Not "or" (alternatives),
# not a new sentence or a correction ("\\boxed{3}. Wait, that's wrong, it is \\boxed{5}").
RUN_GAP = 70
_GAP_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm)\s*\{([^{}]*)\}")
_GAP_FORMAT = re.compile(r"\\(?:qquad|quad|[()\[\],;:! >])|\$|~")
_GAP_JOINED = re.compile(r"^\s*(?:,\s*and\b|,|;|and\b)|(?:,\s*and|\band|,|;)\s*$")
_GAP_VETO = re.compile(
    r"\b(?:or|wait|but|no|not|wrong|incorrect|instead|actually|however|rather|mistake|oops|sorry|"
    r"correct|correction|recheck|check|hmm|so|thus|hence|therefore|answer|final|should|maybe|perhaps|"
    r"either|alternatively|otherwise|else)\b|[.!?](?:\s|$)",
    re.I,
)


def _joins(gap: str) -> bool:
    """Whether the text between two boxes joins them into one answer (see above)."""
    if len(gap) >= RUN_GAP:
        return False
    plain = _GAP_FORMAT.sub(" ", _GAP_TEXT.sub(r" \1 ", gap))
    if not plain.strip():
        return True
    return bool(_GAP_JOINED.search(plain)) and not _GAP_VETO.search(plain)


def boxed_run(text: str) -> list[str]:
    """The last box and the boxes stated together with it just before (see ``_joins``), in order,
    each content once."""
    text = strip_turn_end(text)
    found = _last_closed_box(text)
    if found is None:
        return []
    start, box = found
    parts = [box[0].strip()]
    for _ in range(16):
        prev = _last_box_start(text, start)
        box = _box_at(text, prev) if 0 <= prev and start - prev <= 1000 else None
        if box is None or box[1] > start or not _joins(text[box[1]: start]):
            break
        if box[0].strip() not in parts:
            parts.insert(0, box[0].strip())
        start = prev
    return parts


_MATH_SPAN = re.compile(
    r"\$\$([^$]{1,2000}?)\$\$|\\\[(.{1,2000}?)\\\]|\\\((.{1,2000}?)\\\)|(?<!\\)\$((?:\\\$|[^$\n]){1,2000}?)(?<!\\)\$",
    re.S,
)


def _after_marker(low: str, text: str, markers: tuple[str, ...]) -> tuple[str | None, int]:
    best, pos = -1, -1
    for marker in markers:
        k = low.rfind(marker)
        if k > best:
            best, pos = k, k + len(marker)
    if best < 0:
        return None, -1
    return text[pos: pos + 600], pos


def _first_sentence(snippet: str) -> str:
    """The answer part of "X. I hope it is correct." / "X.\\n\\nmore text"."""
    snippet = snippet.lstrip(" :*\t")
    cut = len(snippet)
    for stop in ("\n\n", ". I hope", ". i hope", "\nI hope", ". \n", ".\n", "<|", "</"):
        k = snippet.find(stop)
        if 0 <= k < cut:
            cut = k
    line_end = snippet.find("\n")
    if 0 <= line_end < cut and not _inside_display(snippet[:line_end]):
        cut = line_end
    k = _sentence_end(snippet[:cut])
    return snippet[:k].strip().strip("*").strip()


def _inside_display(prefix: str) -> bool:
    return prefix.count("\\[") > prefix.count("\\]") or prefix.count("$$") % 2 == 1


def _sentence_end(s: str) -> int:
    """Position of a sentence-ending '. ' outside math ("3.5" and "$x.$" are not ends)."""
    in_math = False
    for k, c in enumerate(s):
        if c == "$":
            in_math = not in_math
        elif c == "." and not in_math and k + 1 < len(s) and s[k + 1] == " " and (k == 0 or not s[k - 1].isdigit() or k + 2 < len(s) and s[k + 2].isupper()):
            return k
    return len(s)


def _answer_from_sentence(sentence: str) -> str:
    """"The largest $n$ is 34" -> "34"; a math span wins over prose."""
    low = sentence.lower()
    k, width = max((low.rfind(w), len(w)) for w in (" is ", " are ", " be ", " est ", "是"))
    if k >= 0 and sentence[k + width:].strip():
        sentence = sentence[k + width:]
    spans = list(_MATH_SPAN.finditer(sentence))
    if not spans:
        return sentence.strip()
    # "$12$ and $13$": spans joined only by connectives form one answer
    parts = [spans[-1]]
    for prev in reversed(spans[:-1]):
        if not _JOINERS.match(sentence[prev.end(): parts[0].start()]):
            break
        parts.insert(0, prev)
    return ", ".join(next(g for g in m.groups() if g is not None).strip() for m in parts)


_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{4,}|[^\x00-\x7f]+")


def has_prose(text: str) -> bool:
    return bool(_PROSE.search(_COMMANDS.sub(" ", text)))


def first_math_chunk(text: str) -> str | None:
    """"Janeth aura encore 220 $ à payer" -> "220 $": the first prose-free piece with a digit."""
    for chunk in _PROSE_WORD.split(text):
        chunk = chunk.strip(" .,;:!?'\"()*")
        if any(c.isdigit() for c in chunk):
            return chunk
    return None


_FINAL = ("final answer is", "final answer:", "final answer\n", "final answer**", "final answer\\]")
_ANSWER_IS = ("the answer is", "answer is:", "answer is", "answer:", "answer :", "**answer**:", "answer**:",
              "réponse:", "réponse :", "réponse est", "答案：", "答案:", "答案是", "الإجابة")
_TAG = re.compile(r"<answer>(.{0,2000}?)</answer>", re.S | re.I)
_TURN_END = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")
_PROSE = re.compile(r"[A-Za-z]{4,}|[^\x00-\x7f]")
_COMMANDS = re.compile(r"\\[A-Za-z]+(?:\{[A-Za-z*]+\})?")


def strip_turn_end(text: str) -> str:
    """Cut leaked chat-template turns: what follows "<|im_start|>" is not this answer."""
    for marker in _TURN_END:
        k = text.find(marker)
        if k > 0:
            text = text[:k]
    return text


def _looks_like_answer(s: str) -> bool:
    return any(c.isdigit() for c in s) or "\\" in s or "$" in s or len(s.strip()) <= 24


def _states_math(s: str) -> bool:
    return any(c.isdigit() for c in s) or "\\" in s or "$" in s


def _marked(text: str) -> list[tuple[int, Extraction]]:
    """Explicitly marked answers with the position where each was stated."""
    found: list[tuple[int, Extraction]] = []
    box_at = _last_box_start(text, len(text))
    box = last_boxed(text)
    if box is not None:
        found.append((box_at, Extraction(box, "boxed")))
    tail_start = max(0, len(text) - MAX_TAIL)
    tail = text[tail_start:]
    low = tail.lower()
    for markers, rule in ((_FINAL, "final_answer"), (_ANSWER_IS, "answer_is")):
        snippet, at = _after_marker(low, tail, markers)
        if snippet is None:
            continue
        sentence = _first_sentence(snippet)
        if sentence and _looks_like_answer(sentence):
            found.append((tail_start + at, Extraction(_answer_from_sentence(sentence), rule)))
    tags = list(_TAG.finditer(tail))
    if tags and tags[-1].group(1).strip():
        found.append((tail_start + tags[-1].start(), Extraction(tags[-1].group(1).strip(), "answer_tag")))
    k = tail.rfind("####")
    if k >= 0:
        line = tail[k + 4:].strip().split("\n", 1)[0].strip()
        if line:
            found.append((tail_start + k, Extraction(line, "hashes")))
    return found


def extract(text: str, allow_fallback: bool = True) -> Extraction | None:
    """The final answer of a response and the rule that found it.

    Among explicitly marked answers the one stated last wins (a closing "Final
    Answer: ..." overrides boxes in earlier scratch work; a box inside
    "the answer is $\\boxed{5}$" comes after its marker and wins).
    """
    text = strip_turn_end(text)
    found = _marked(text)
    if found:
        priority = {"answer_is": 0, "hashes": 1, "answer_tag": 2, "final_answer": 3, "boxed": 4}
        found.sort(key=lambda item: (item[0], priority[item[1].rule]))
        best = found[-1][1]
        if best.rule == "answer_is" and any(e.rule == "boxed" for _, e in found) and not _states_math(best.text):
            best = next(e for _, e in found if e.rule == "boxed")
        return best
    if not allow_fallback:
        return None
    return fallback(text)


def fallback(text: str) -> Extraction | None:
    """Flexible mode: a math-only response is its own answer; else the last math span or number."""
    stripped = text.strip()
    if 0 < len(stripped) <= 300 and not _PROSE.search(_COMMANDS.sub(" ", stripped)):
        return Extraction(stripped, "whole")
    tail = text[-MAX_TAIL:]
    spans = list(_MATH_SPAN.finditer(tail))
    span = spans[-1] if spans else None
    number = None
    for m in _NUMBER.finditer(tail):
        if span is None or m.start() >= span.end():
            number = m
    if number is not None:
        return Extraction(number.group(0).replace("$", "").rstrip(","), "last_number")
    if span is not None:
        inner = next(g for g in span.groups() if g is not None)
        if inner.strip():
            return Extraction(inner, "last_math")
    return None


_NUMBER = re.compile(r"(?<![A-Za-z\d.])(?:-?\$?\d[\d,]*(?:\.\d+)?(?:\s?/\s?\d+)?|-?\.\d+)(?!\d)")


def last_number(text: str) -> str | None:
    tail = text[-MAX_TAIL:]
    found = None
    for m in _NUMBER.finditer(tail):
        found = m
    if found is None:
        return None
    return found.group(0).replace("$", "").rstrip(",")
