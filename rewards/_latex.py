"""A small, safe recursive-descent parser for the LaTeX / plain-math answer subset.

It never executes model text: it tokenises by hand and builds a tree of plain
tuples (the AST below).  ``rewards._sympy_bridge`` turns that tree into sympy
objects by calling constructors (``Integer``, ``Rational``, ``Add``...) with
guarded sizes; nothing is passed to ``eval``/``sympify``/``parse_expr``.

AST nodes (tuples, first item is the tag)::

    ("num", text)            decimal literal, e.g. "12", "0.5"
    ("sym", name)            variable, e.g. "x", "a_1", "\\alpha"
    ("const", name)          "pi", "e", "i", "inf"
    ("add", (t1, t2, ...))   ("neg", t)   ("mul", (f1, ...))   ("div", a, b)
    ("pow", base, exp)       ("root", x, n)   ("func", name, arg)   ("fact", x)
    ("pct", x)               a percentage written x%
    ("pm", a, b)             a ± b
    ("mixed", whole, frac)   mixed number 2\\frac12
    ("abs", x)  ("binom", n, k)  ("base", digits, base)  ("text", words)
    ("tuple", items)  ("set", items)  ("list", items)  ("interval", lo, hi, lo_closed, hi_closed)
    ("union", parts)  ("matrix", rows)  ("rel", ops, exprs)  ("ellipsis",)
    ("ratio", parts)         a ratio written a:b (or a:b:c)
    ("clock", (h, mm), meridiem)   a time of day h:mm, meridiem "am", "pm" or ""
"""

from __future__ import annotations

import math

from rewards._normalize import MAX_ANSWER_CHARS, clean_latex


class ParseError(ValueError):
    pass


MAX_DEPTH = 64  # nesting deeper than this is not a real answer
MAX_TOKENS = 800

_FUNCS = {
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "ln", "log", "exp", "lg", "arccot", "arcsec", "arccsc",
}
_TEXT_CMDS = {"text", "textbf", "textit", "textrm", "textnormal", "mbox", "textsf", "texttt", "hbox"}
_STYLE_CMDS = {"mathrm", "mathbf", "mathit", "mathsf", "mathnormal", "boldsymbol", "bm", "operatorname",
               "mathcal", "mathbb", "vec", "overline", "hat", "bar", "widehat", "tilde", "overrightarrow",
               "boxed", "fbox", "underline", "mathtt", "textup", "emph"}
_RELS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "!=": "!=", "le": "<=", "ge": ">=",
         "lt": "<", "gt": ">", "ne": "!=", "approx": "~", "in": "in", "equiv": "=", "sim": "~",
         "simeq": "~", "cong": "="}
_NON_ATOM_CMDS = {"cdot", "times", "div", "pm", "mp", "cup", "cap", "setminus", "to", "end", "right",
                  "rightarrow", "Rightarrow", "implies", "quad", "land", "lor", "wedge", "vee", "mid",
                  "rfloor", "rceil", "rangle", "dots", "ldots", "cdots"} | set(_RELS)
_CONSTS = {"pi": "pi", "infty": "inf", "infinity": "inf", "imath": "i"}
_EMPTY = {"emptyset", "varnothing", "empty"}
_ELLIPSIS = {"dots", "ldots", "cdots", "vdots", "ddots"}
_MATRIX_ENVS = {"pmatrix", "bmatrix", "matrix", "vmatrix", "Bmatrix", "smallmatrix", "array"}
# Multi-letter words that are units or English, not products of one-letter variables.
_WORDS = {
    "cm", "mm", "km", "ft", "yd", "mi", "kg", "mg", "lb", "lbs", "oz", "hr", "hrs", "min", "mins", "sec",
    "secs", "mph", "sq", "cu", "and", "or", "the", "are", "is", "of", "per", "day", "yes", "no", "odd",
    "not", "deg", "rad", "cents", "ml", "cc", "in", "am", "pm", "inch", "feet", "foot", "to", "at",
    "sum",
}
_PERCENT_WORDS = {"percent", "percentage", "pct", "percents"}
_PLAIN_FUNCS = _FUNCS | {"sqrt"}


# ----------------------------------------------------------------------------- tokens

def tokenize(s: str) -> list[tuple[str, str]]:
    toks: list[tuple[str, str]] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c.isspace():
            if c == "\n" and toks and toks[-1][0] == "NUM" and s[i + 1: i + 2].isdigit():
                toks.append(("OP", ","))  # numbers on separate lines are separate answers
            i += 1
        elif s.startswith("...", i):
            toks.append(("CMD", "dots"))
            i += 3
        elif c.isdigit() or (c == "." and i + 1 < n and s[i + 1].isdigit()):
            i = _scan_number(s, i, toks)
        elif c.isalpha():
            j = i
            while j < n and s[j].isalpha():
                j += 1
            _emit_word(s[i:j], toks)
            i = j
        elif c == "\\":
            i = _scan_command(s, i, toks)
        elif c in "<>!=" and i + 1 < n and s[i + 1] == "=":
            toks.append(("REL", c + "=" if c != "=" else "="))
            i += 2
        elif c in "<>=":
            toks.append(("REL", c))
            i += 1
        elif c == "*" and i + 1 < n and s[i + 1] == "*":
            toks.append(("OP", "^"))
            i += 2
        elif c in "+-*/^_!'|,;:&":
            toks.append(("OP", c))
            i += 1
        elif c in "{}()[]":
            toks.append((c, c))
            i += 1
        elif c == "%":
            toks.append(("PCT", "%"))
            i += 1
        elif c in ".?\"`":
            i += 1  # stray punctuation carries no math
        else:
            toks.append(("WORD", c))  # any other script: treated as prose
            i += 1
        if len(toks) > MAX_TOKENS:
            raise ParseError("too many tokens")
    return toks


def _scan_number(s: str, i: int, toks: list) -> int:
    n = len(s)
    j = i
    while j < n and s[j].isdigit():
        j += 1
    digits = s[i:j]
    # Thousands separators "12,000,023" / "1 000": all groups of three, or none at all.
    if 0 < j - i <= 3:
        k, sep, groups = j, None, []
        while k < n and s[k] in ", " and (sep is None or s[k] == sep):
            group = s[k + 1: k + 4]
            if len(group) == 3 and group.isdigit() and not (k + 4 < n and s[k + 4].isdigit()):
                sep = s[k]
                groups.append(group)
                k += 4
            else:
                break
        list_like = k + 1 < n and s[k] == "," and s[k + 1].isdigit()
        if groups and not list_like:
            digits += "".join(groups)
            j = k
    if j < n and s[j] == "." and j + 1 < n and s[j + 1].isdigit():
        k = j + 1
        while k < n and s[k].isdigit():
            k += 1
        digits += s[j:k]
        j = k
    if len(digits) > 400:
        raise ParseError("number too long")
    toks.append(("NUM", digits))
    return j


def _emit_word(word: str, toks: list) -> None:
    low = word.lower()
    if len(word) == 1:
        toks.append(("ID", word))
    elif low in _PERCENT_WORDS:
        toks.append(("PCT", "%"))
    elif low in ("and", "or"):
        toks.append(("OP", ","))
    elif low in _PLAIN_FUNCS or low == "pi":
        toks.append(("CMD", low))
    elif low in _WORDS or len(word) >= 4 or not word.isascii():
        toks.append(("WORD", word))
    else:
        toks.extend(("ID", ch) for ch in word)


def _scan_command(s: str, i: int, toks: list) -> int:
    n = len(s)
    j = i + 1
    while j < n and s[j].isalpha():
        j += 1
    name = s[i + 1: j]
    if not name:
        nxt = s[i + 1: i + 2]
        if nxt == "{":
            toks.append(("LSET", "\\{"))
        elif nxt == "}":
            toks.append(("RSET", "\\}"))
        elif nxt == "\\":
            toks.append(("ROW", "\\\\"))
        elif nxt == "|":
            toks.append(("OP", "|"))
        elif nxt == "%":
            toks.append(("PCT", "%"))
        return i + 2
    if name in _TEXT_CMDS:
        content, j = _read_group(s, j)
        content = content.strip()
        toks.append(("OP", ",") if content in ("and", "or", ",") else ("TEXT", content))
        return j
    toks.append(("CMD", name))
    return j


def _read_group(s: str, j: int) -> tuple[str, int]:
    """Raw text of the brace group starting at s[j] (after spaces)."""
    n = len(s)
    while j < n and s[j] == " ":
        j += 1
    if j >= n or s[j] != "{":
        return "", j
    depth, k = 0, j
    while k < n:
        if s[k] == "{":
            depth += 1
        elif s[k] == "}":
            depth -= 1
            if depth == 0:
                return s[j + 1: k], k + 1
        k += 1
    raise ParseError("unbalanced braces")


# ----------------------------------------------------------------------------- parser

_CLOSERS = {"(": (")", "]"), "[": ("]", ")"), "{": ("}",), "LSET": ("RSET",)}


class _Parser:
    def __init__(self, toks: list[tuple[str, str]]):
        self.toks = toks + [("EOF", "")]
        self.pos = 0
        self.depth = 0

    # -- helpers
    def peek(self, k: int = 0) -> tuple[str, str]:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def next(self) -> tuple[str, str]:
        tok = self.toks[self.pos]
        self.pos += 1
        return tok

    def accept(self, kind: str, value: str | None = None) -> bool:
        k, v = self.peek()
        if k == kind and (value is None or v == value):
            self.pos += 1
            return True
        return False

    def expect(self, kind: str, value: str | None = None) -> None:
        if not self.accept(kind, value):
            raise ParseError(f"expected {value or kind}, got {self.peek()}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    # -- grammar
    def parse(self):
        items = self.parse_list()
        if self.peek()[0] != "EOF":
            raise ParseError(f"trailing input at {self.peek()}")
        return items[0] if len(items) == 1 else ("list", tuple(items))

    def parse_list(self) -> list:
        items = [self.parse_rel()]
        while self.peek() in (("OP", ","), ("OP", ";")):
            while self.peek() in (("OP", ","), ("OP", ";")):
                self.next()
            if self.peek()[0] in ("EOF", ")", "]", "}", "RSET"):
                break
            items.append(self.parse_rel())
        return items

    def parse_rel(self):
        exprs, ops = [self.parse_ratio()], []
        while True:
            k, v = self.peek()
            if k == "REL":
                op = _RELS[v]
            elif k == "CMD" and v in _RELS:
                op = _RELS[v]
            else:
                break
            self.next()
            ops.append(op)
            exprs.append(self.parse_ratio())
        return ("rel", tuple(ops), tuple(exprs)) if ops else exprs[0]

    def parse_ratio(self):
        """``S_1:S_2 = 7:32``: a ratio binds looser than arithmetic, tighter than relations.
        A clock time (``5:00 PM``, ``12:30``) is a ``clock`` node, never a ratio."""
        start = self.pos
        parts = [self.parse_expr()]
        while self.accept("OP", ":"):
            parts.append(self.parse_expr())
        if len(parts) == 1:
            return parts[0]
        return _clock(self.toks[start: self.pos]) or ("ratio", tuple(parts))

    def parse_expr(self):
        parts = [self.parse_sum()]
        while self.peek() == ("CMD", "cup"):
            self.next()
            parts.append(self.parse_sum())
        return ("union", tuple(parts)) if len(parts) > 1 else parts[0]

    def parse_sum(self):
        self.enter()
        terms: list = []
        pm = None
        k, v = self.peek()
        first_sign = None
        if (k, v) in (("OP", "+"), ("OP", "-"), ("CMD", "pm"), ("CMD", "mp")):
            first_sign = v
            self.next()
        term = self.parse_product()
        if first_sign == "-":
            term = ("neg", term)
        elif first_sign in ("pm", "mp"):
            pm = (("num", "0"), term)
            term = None
        if term is not None:
            terms.append(term)
        while True:
            k, v = self.peek()
            if (k, v) == ("OP", "+"):
                self.next()
                terms.append(self.parse_product())
            elif (k, v) == ("OP", "-"):
                self.next()
                terms.append(("neg", self.parse_product()))
            elif (k, v) in (("CMD", "pm"), ("CMD", "mp")):
                self.next()
                left = _mk_add(terms) if terms else ("num", "0")
                pm = (left, self.parse_product())
                terms = []
            else:
                break
        self.depth -= 1
        if pm is not None:
            node = ("pm", pm[0], pm[1])
            return _mk_add([node] + terms) if terms else node
        return _mk_add(terms)

    def parse_product(self):
        self.enter()
        node = self.parse_unary()
        factors = [node]
        while True:
            k, v = self.peek()
            if (k, v) in (("OP", "*"), ("CMD", "cdot"), ("CMD", "times"), ("CMD", "ast")):
                self.next()
                factors.append(self.parse_unary())
            elif (k, v) in (("OP", "/"), ("CMD", "div")):
                self.next()
                den = self.parse_unary()
                factors = [("div", _mk_mul(factors), den)]
            elif k in ("TEXT", "WORD"):
                self._skip_unit()
            elif self._starts_atom(k, v):
                nxt = self.parse_power()
                mixed = _as_mixed(factors, nxt, self)
                if mixed is not None:
                    factors = [mixed]
                else:
                    factors.append(nxt)
            else:
                break
        self.depth -= 1
        return _mk_mul(factors)

    def _skip_unit(self) -> None:
        """A unit after a quantity ("5\\text{ cm}^2", "125 miles") carries no value."""
        self.next()
        if self.peek() == ("OP", "^"):
            self.next()
            self.parse_exponent()

    def _starts_atom(self, k: str, v: str) -> bool:
        if k in ("NUM", "ID", "(", "{", "LSET"):
            return True
        return k == "CMD" and v not in _NON_ATOM_CMDS

    def parse_unary(self):
        k, v = self.peek()
        if (k, v) == ("OP", "-"):
            self.next()
            return ("neg", self.parse_unary())
        if (k, v) == ("OP", "+"):
            self.next()
            return self.parse_unary()
        if (k, v) in (("CMD", "pm"), ("CMD", "mp")):
            self.next()
            return ("pm", ("num", "0"), self.parse_unary())
        return self.parse_power()

    def parse_power(self):
        self.enter()
        base = self.parse_postfix()
        if self.accept("OP", "^"):
            base = ("pow", base, self.parse_exponent())
            base = self._postfix_ops(base)
        self.depth -= 1
        return base

    def parse_exponent(self):
        k, v = self.peek()
        if k == "{":
            return self.parse_group()
        if (k, v) == ("OP", "-"):
            self.next()
            return ("neg", self.parse_exponent())
        return self.parse_power()

    def parse_postfix(self):
        return self._postfix_ops(self.parse_atom())

    def _postfix_ops(self, node):
        while True:
            k, v = self.peek()
            if (k, v) == ("OP", "!"):
                self.next()
                node = ("fact", node)
            elif k == "PCT":
                self.next()
                node = ("pct", node)
            elif (k, v) == ("OP", "'"):
                self.next()
                node = ("sym", _name(node) + "'")
            elif (k, v) == ("OP", "_"):
                self.next()
                node = self._subscript(node)
            else:
                return node

    def _subscript(self, node):
        k, v = self.peek()
        if k == "{":
            start = self.pos
            sub = self.parse_group()
            text = _flat_text(self.toks[start: self.pos])
        else:
            self.next()
            sub, text = (k, v), v
        if node[0] == "num" and (sub[0] == "num" or (isinstance(sub, tuple) and sub[0] == "NUM")):
            return ("base", node[1], text.strip("{}"))
        if node[0] == "func":  # \log_2 x is handled by the func parser; keep going
            return node
        return ("sym", _name(node) + "_" + text)

    def parse_group(self):
        """A brace group {...}: its content (a list becomes a set, as in ${1,3}$)."""
        self.expect("{")
        if self.accept("}"):
            return ("text", "")
        items = self.parse_list()
        self.expect("}")
        return items[0] if len(items) == 1 else ("set", tuple(items))

    def parse_arg(self):
        """A command argument: a brace group or one token (\\frac13, \\sqrt3)."""
        k, v = self.peek()
        if k == "{":
            return self.parse_group()
        if k == "NUM":
            self.next()
            if len(v) > 1 and v.isdigit():  # \frac13 reads one digit at a time
                self.toks.insert(self.pos, ("NUM", v[1:]))
                return ("num", v[0])
            return ("num", v)
        if k == "ID":
            self.next()
            return _id_node(v)
        if k == "CMD":
            return self.parse_atom()
        raise ParseError(f"bad argument {self.peek()}")

    def parse_atom(self):
        self.enter()
        k, v = self.next()
        self.depth -= 1
        if k == "NUM":
            return ("num", v)
        if k == "ID":
            return _id_node(v)
        if k in ("TEXT", "WORD"):
            return _text_node(v)
        if k in ("(", "["):
            return self._bracketed(k)
        if k == "{":
            self.pos -= 1
            return self.parse_group()
        if k == "LSET":
            if self.accept("RSET"):
                return ("set", ())
            items = self.parse_list()
            self.expect("RSET")
            return ("set", tuple(items))
        if (k, v) == ("OP", "|"):
            inner = self.parse_expr()
            self.expect("OP", "|")
            return ("abs", inner)
        if k == "CMD":
            return self._command(v)
        raise ParseError(f"unexpected {k} {v!r}")

    def _bracketed(self, opener: str):
        if self.peek()[0] in (")", "]"):
            self.next()
            return ("tuple", ())
        items = self.parse_list()
        closer = self.next()[0]
        if closer not in _CLOSERS[opener]:
            raise ParseError("unbalanced brackets")
        if len(items) == 1 and opener == "(" and closer == ")":
            return items[0]
        if len(items) == 2 and (opener == "[" or closer == "]"):
            return ("interval", items[0], items[1], opener == "[", closer == "]")
        if len(items) == 1:
            return items[0]
        return ("tuple", tuple(items))

    def _command(self, name: str):
        if name == "frac":
            num = self.parse_arg()
            return ("div", num, self.parse_arg())
        if name == "binom":
            top = self.parse_arg()
            return ("binom", top, self.parse_arg())
        if name == "sqrt":
            index = None
            if self.accept("["):
                index = self.parse_rel()
                self.expect("]")
            return ("root", self.parse_arg(), index)
        if name in _CONSTS:
            return ("const", _CONSTS[name])
        if name in _EMPTY:
            return ("set", ())
        if name in _ELLIPSIS:
            return ("ellipsis",)
        if name in _FUNCS:
            return self._function(name)
        if name in ("lfloor", "lceil"):
            inner = self.parse_expr()
            if not (self.accept("CMD", "rfloor") or self.accept("CMD", "rceil")):
                raise ParseError("unclosed floor")
            return ("func", name[1:], inner)
        if name == "langle":
            items = self.parse_list()
            self.expect("CMD", "rangle")
            return ("tuple", tuple(items))
        if name in ("lvert", "vert", "lVert", "Vert"):
            inner = self.parse_expr()
            if not any(self.accept("CMD", c) for c in ("rvert", "vert", "rVert", "Vert")):
                raise ParseError("unclosed abs")
            return ("abs", inner)
        if name == "begin":
            return self._environment()
        if name in _STYLE_CMDS:
            if self.peek()[0] != "{":
                return self.parse_atom()
            start = self.pos
            inner = self.parse_group()
            if name in ("mathrm", "operatorname", "mathbf") and inner[0] in ("sym", "mul"):
                text = _flat_text(self.toks[start + 1: self.pos - 1])
                return _text_node(text) if len(text) > 1 else _id_node(text)
            return inner
        if name in ("mathrm",):
            return self.parse_atom()
        if name in _NON_ATOM_CMDS:
            raise ParseError(f"misplaced \\{name}")
        return ("sym", "\\" + name)  # \alpha, \theta, unknown macros: plain symbols

    def _function(self, name: str):
        power = None
        base = None
        if self.accept("OP", "_"):
            base = self.parse_arg()
        if self.accept("OP", "^"):
            power = self.parse_exponent()
        if self.peek()[0] in ("(", "{"):
            open_kind = self.next()[0]
            arg = self.parse_rel() if open_kind == "(" else self.parse_list()[0]
            self.expect(")" if open_kind == "(" else "}")
        else:
            arg = self.parse_power()
        node = ("func", name, arg)
        if base is not None:
            node = ("div", ("func", "ln", arg), ("func", "ln", base))
        if power is not None:
            node = ("pow", node, power)
        return node

    def _environment(self):
        env = _flat_text(self._group_tokens())
        if env not in _MATRIX_ENVS:
            raise ParseError(f"environment {env}")
        if env == "array":
            self._group_tokens()  # column spec {cc}
        rows, row = [], []
        while True:
            if self.peek() == ("CMD", "end"):
                self.next()
                self._group_tokens()
                break
            if self.peek()[0] == "EOF":
                raise ParseError("unclosed environment")
            row.append(self.parse_rel())
            k, v = self.next()
            if (k, v) == ("OP", "&"):
                continue
            if k == "ROW":
                rows.append(tuple(row))
                row = []
                continue
            if (k, v) == ("CMD", "end"):
                self._group_tokens()
                break
            raise ParseError("bad matrix cell")
        if row:
            rows.append(tuple(row))
        return ("matrix", tuple(rows))

    def _group_tokens(self) -> list:
        self.expect("{")
        start = self.pos
        depth = 1
        while depth:
            k, _ = self.next()
            if k == "EOF":
                raise ParseError("unclosed group")
            depth += (k == "{") - (k == "}")
        return self.toks[start: self.pos - 1]


def _flat_text(toks) -> str:
    return "".join(v for _, v in toks if v not in ("{", "}"))


def _name(node) -> str:
    if node[0] in ("sym", "const", "text"):
        return str(node[1])
    if node[0] == "num":
        return node[1]
    raise ParseError("bad name")


def _id_node(letter: str):
    if letter == "e":
        return ("const", "e")
    if letter == "i":
        return ("const", "i")
    return ("sym", letter)


def _text_node(text: str):
    words = " ".join(text.split())
    if len(words) >= 3 and words[0] == "(" and words[-1] == ")":
        words = words[1:-1].strip()  # "\text{(C)}" names choice C
    if len(words) == 1 and words.isalpha():
        return ("sym", words)
    return ("text", words)


def _mk_add(terms):
    if not terms:
        raise ParseError("empty sum")
    return terms[0] if len(terms) == 1 else ("add", tuple(terms))


def _mk_mul(factors):
    if len(factors) > 1:  # units ("\\mathrm{cm}") multiply nothing
        kept = [f for f in factors if f[0] != "text"]
        factors = kept or factors[:1]
    return factors[0] if len(factors) == 1 else ("mul", tuple(factors))


def _is_int_num(node) -> bool:
    return node[0] == "num" and node[1].isdigit()


def _as_mixed(factors, nxt, parser: _Parser):
    """``2\\frac12`` and ``4 4/9`` are mixed numbers, not products (NeMo-Skills, Math-Verify)."""
    if len(factors) != 1 or not _is_int_num(factors[0]):
        return None
    if nxt[0] == "div" and _is_int_num(nxt[1]) and _is_int_num(nxt[2]):
        return ("mixed", factors[0], nxt)
    if _is_int_num(nxt) and parser.peek() == ("OP", "/") and parser.peek(1)[0] == "NUM":
        parser.next()
        _, den = parser.next()
        return parser._postfix_ops(("mixed", factors[0], ("div", nxt, ("num", den))))
    return None


def _clock(toks):
    """``h:mm`` read as a time of day: ("clock", (h, mm), "am" | "pm" | ""), or None.

    A time when the minutes are two digits (hour at most 24, minutes below 60) and either
    start with 0 (``9:00``, ``3:05``), or "am"/"pm" follows, or the two terms share a factor
    (``12:30``, ``10:10``: a ratio would be stated reduced).  ``7:32`` stays a ratio.
    """
    if len(toks) < 3 or toks[0][0] != "NUM" or toks[1] != ("OP", ":") or toks[2][0] != "NUM":
        return None
    hour, minute = toks[0][1], toks[2][1]
    if not (hour.isdigit() and len(hour) <= 2 and int(hour) <= 24 and minute.isdigit() and len(minute) == 2
            and int(minute) < 60):
        return None
    rest = toks[3:]
    if any(k not in ("WORD", "TEXT", "ID", "{", "}") and (k, v) != ("CMD", "mathrm") for k, v in rest):
        return None
    meridiem = "".join(ch for k, v in rest if k in ("WORD", "TEXT", "ID") for ch in v.lower() if ch.isalpha())
    if meridiem not in ("", "am", "pm"):
        return None
    if not (minute[0] == "0" or meridiem or math.gcd(int(hour), int(minute)) > 1):
        return None
    return ("clock", (("num", hour), ("num", minute)), meridiem)


def parse_answer(answer: str):
    """Parse one extracted answer into the AST above; raises ParseError when it is not math."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise ParseError("answer too long")
    text = clean_latex(answer)
    if not text:
        raise ParseError("empty")
    return _Parser(tokenize(text)).parse()
