"""The ``calculator`` tool: exact arithmetic on what the model writes between tool tags.

The model calls it with ``<calc>EXPRESSION</calc>`` inside its turn; the environment answers
with ``<result>VALUE</result>`` or ``<error>WHY</error>``. EXPRESSION is integers or decimals
with ``+ - * /``, unary minus and parentheses; nothing else. It is parsed by the recursive-
descent parser below (never ``eval``/``exec``: model text is data), evaluated exactly with
``fractions.Fraction``, and every cost is bounded before it is paid:

- the expression's length (``MAX_CHARS``) is checked before any parsing, so a 10^6-character
  input costs one ``len``;
- nesting depth (``MAX_DEPTH``) is counted, so deep parentheses never reach Python's recursion
  limit;
- a number literal has at most ``MAX_DIGITS`` digits, and every intermediate value's size (digits
  of numerator and denominator) is checked after each operation; with the length cap this bounds
  the work of any input (there is no power operator, so sizes grow at most additively).

Any violation, a syntax error or a division by zero is an ``<error>`` observation naming it:
the model sees what went wrong and may try again.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 256  # expression length
MAX_DEPTH = 32  # nested parentheses / unary minus
MAX_DIGITS = 40  # digits of a literal, and of an intermediate numerator or denominator
RESULT_DECIMALS = 6  # non-integer results are shown rounded to this many decimals

TOKEN = re.compile(r"\s*(?:([0-9]+(?:\.[0-9]+)?)|(\S))")  # ASCII digits only


class CalcError(ValueError):
    """What the calculator tells the model instead of a value."""


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None:  # only trailing whitespace is left
            break
        number, other = m.group(1), m.group(2)
        if number is not None:
            if len(number.replace(".", "")) > MAX_DIGITS:
                raise CalcError(f"a number has more than {MAX_DIGITS} digits")
            out.append(number)
        elif other is not None:
            if other not in "+-*/()":
                raise CalcError(f"unexpected character {other!r}: use numbers, + - * / and parentheses")
            out.append(other)
        pos = m.end()
    return out


def _checked(value: Fraction) -> Fraction:
    if len(str(abs(value.numerator))) > MAX_DIGITS or len(str(value.denominator)) > MAX_DIGITS:
        raise CalcError(f"a value has more than {MAX_DIGITS} digits")
    return value


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
    unary := '-' unary | '+' unary | atom ; atom := NUMBER | '(' expr ')'"""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise CalcError("the expression ends too early")
        self.pos += 1
        return token

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalcError(f"nested more than {MAX_DEPTH} deep")

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term()
            value = _checked(value + rhs if op == "+" else value - rhs)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.unary()
            if op == "/" and rhs == 0:
                raise CalcError("division by zero")
            value = _checked(value * rhs if op == "*" else value / rhs)
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("-", "+"):
            op = self.take()
            self.enter()
            value = self.unary()
            self.depth -= 1
            return -value if op == "-" else value
        return self.atom()

    def atom(self) -> Fraction:
        token = self.take()
        if token == "(":
            self.enter()
            value = self.expr()
            if self.take() != ")":
                raise CalcError("a '(' is not closed")
            self.depth -= 1
            return value
        if token[0].isdigit():
            return Fraction(token)
        raise CalcError(f"expected a number or '(', got {token!r}")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``, or ``CalcError`` saying why there is none."""
    if len(expression) > MAX_CHARS:
        raise CalcError(f"the expression is longer than {MAX_CHARS} characters")
    tokens = _tokens(expression)
    if not tokens:
        raise CalcError("the expression is empty")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.peek() is not None:
        raise CalcError(f"unexpected {parser.peek()!r} after a complete expression")
    return value


def show(value: Fraction) -> str:
    """An integer as digits; anything else rounded to ``RESULT_DECIMALS`` decimals (trailing zeros cut)."""
    if value.denominator == 1:
        return str(value.numerator)
    scaled = round(value * 10**RESULT_DECIMALS)
    sign, digits = ("-" if scaled < 0 else ""), str(abs(scaled)).rjust(RESULT_DECIMALS + 1, "0")
    text = f"{digits[:-RESULT_DECIMALS]}.{digits[-RESULT_DECIMALS:]}".rstrip("0").rstrip(".")
    return sign + text if text != "0" else "0"


def run_tool(expression: str) -> tuple[str, bool]:
    """(observation text, ok): ``<result>v</result>`` or ``<error>why</error>``."""
    try:
        return f"<result>{show(evaluate(expression))}</result>", True
    except CalcError as exc:
        return f"<error>{exc}</error>", False
