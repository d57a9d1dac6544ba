"""Equivalence of two parsed answers, in cheap layers.

1. identical canonical strings / identical trees;
2. structure (tuples ordered; sets, bare lists and unions order-insensitive;
   intervals, matrices, equations ``x=3`` vs ``3``, inequalities, ``±``,
   percentages) down to scalars.  A labelled answer is its value
   (``(p,q)=(3,2)``, ``AB=4, CD=5``, ``f(x)=1``, ``S_1:S_2=7:32``); an inequality
   in one unknown is the interval or union it describes (``x>2`` is
   ``(2,\\infty)``); sums, multiples and products of matrices are evaluated
   entry by entry;
3. scalars: exact rational arithmetic (``fractions.Fraction``) where the value is
   rational, complex floats otherwise; expressions with variables are compared
   at a few deterministic rational points (a polynomial-identity test, the
   numeric form of ``simplify(a - b) == 0``).

A scalar comparison this layer cannot decide (``Undecided``) is left to the
sympy layer (``rewards._sympy_bridge``), which runs under a hard timeout.

Every step is bounded: exact powers are only computed when the result has at
most ``MAX_EXACT_BITS`` bits, factorials up to ``MAX_FACTORIAL``, container
matching is quadratic in at most ``MAX_ITEMS`` items.
"""

from __future__ import annotations

import cmath
import math
import zlib
from fractions import Fraction

MAX_EXACT_BITS = 50_000
MAX_FACTORIAL = 3_000
MAX_ITEMS = 64
TRIALS = 3
REL_TOL = 1e-9  # two exact irrationals (floats of the same closed form)
APPROX_TOL = 5e-7  # a decimal literal against an exact value: equal to six places, as Math-Verify


class Undefined(ArithmeticError):
    """The expression has no finite value here (division by 0, overflow, unsupported)."""


class TooBig(Undefined):
    """A value too large to compute; no layer (sympy included) compares it."""


class Undecided(Exception):
    """The numeric layers cannot settle the comparison; the symbolic layer may."""


# ----------------------------------------------------------------------------- evaluation

Value = "Fraction | complex"


def _to_c(x) -> complex:
    if isinstance(x, Fraction):
        try:
            return complex(float(x))
        except OverflowError as exc:
            raise TooBig("overflow") from exc
    return x


def _finite(z: complex) -> complex:
    if not (math.isfinite(z.real) and math.isfinite(z.imag)):
        raise TooBig("not finite")
    return z


def _exact_root(x: Fraction, q: int) -> Fraction | None:
    """The rational q-th root of x >= 0 when there is one."""
    def iroot(n: int) -> int | None:
        if n.bit_length() > 4000:
            return None
        r = math.isqrt(n) if q == 2 else int(round(n ** (1.0 / q))) if n.bit_length() < 1000 else None
        if r is None:
            return None
        for cand in (r - 1, r, r + 1):
            if cand >= 0 and cand ** q == n:
                return cand
        return None

    num, den = iroot(x.numerator), iroot(x.denominator)
    return None if num is None or den is None else Fraction(num, den)


def _pow(a, b):
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if b.denominator == 1:
            e = b.numerator
            if a == 0:
                if e < 0:
                    raise Undefined("0^-n")
                return Fraction(0) if e > 0 else Fraction(1)
            if a == 1 or a == -1:
                return a if e % 2 else Fraction(1)
            bits = max(a.numerator.bit_length(), a.denominator.bit_length())
            if abs(e) * bits <= MAX_EXACT_BITS:
                return a ** e
        elif b.denominator <= 12:
            q = b.denominator
            if a >= 0 or q % 2 == 1:
                root = _exact_root(abs(a), q)
                if root is not None:
                    return _pow(root if a >= 0 else -root, Fraction(b.numerator))
                if a < 0:  # odd root of a negative real is real (MATH convention: \sqrt[3]{-8} = -2)
                    return _finite(-_to_c(_pow(-a, b)))
    za, zb = _to_c(a), _to_c(b)
    try:
        if za == 0:
            if zb.real > 0:
                return complex(0)
            raise Undefined("0^-x")
        if za.imag == 0 and zb.imag == 0 and za.real > 0:
            return _finite(complex(za.real ** zb.real))
        return _finite(za ** zb)
    except OverflowError as exc:
        raise TooBig("pow") from exc
    except ZeroDivisionError as exc:
        raise Undefined("pow") from exc


def _func(name: str, x):
    z = _to_c(x)
    try:
        if name in ("floor", "ceil"):
            if isinstance(x, Fraction):
                return Fraction(math.floor(x) if name == "floor" else math.ceil(x))
            return complex(math.floor(z.real) if name == "floor" else math.ceil(z.real))
        if name in ("ln", "log", "lg"):  # MATH writes log for the natural log or base 10; ln(x) is cmath.log
            if z == 0:
                raise Undefined("log 0")
            return cmath.log(z) if name == "ln" else (cmath.log10(z) if name == "lg" else cmath.log(z))
        fn = _CFUNCS[name]
        return _finite(fn(z))
    except OverflowError as exc:
        raise TooBig(name) from exc
    except (ValueError, ZeroDivisionError) as exc:
        raise Undefined(name) from exc


_CFUNCS = {
    "sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan, "exp": cmath.exp,
    "sec": lambda z: 1 / cmath.cos(z), "csc": lambda z: 1 / cmath.sin(z), "cot": lambda z: 1 / cmath.tan(z),
    "arcsin": cmath.asin, "arccos": cmath.acos, "arctan": cmath.atan, "sinh": cmath.sinh,
    "cosh": cmath.cosh, "tanh": cmath.tanh, "arccot": lambda z: cmath.atan(1 / z),
    "arcsec": lambda z: cmath.acos(1 / z), "arccsc": lambda z: cmath.asin(1 / z),
}


def _num(text: str) -> Fraction:
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise Undefined("number") from exc


def evaluate(node, env: dict):
    """Value of a scalar AST node: ``Fraction`` when exact, ``complex`` otherwise."""
    tag = node[0]
    if tag == "num":
        return _num(node[1])
    if tag == "sym":
        if node[1] in env:
            return env[node[1]]
        raise Undefined("free symbol")
    if tag == "const":
        return _CONST_VALUES[node[1]]()
    if tag == "add":
        vals = [evaluate(t, env) for t in node[1]]
        if all(isinstance(v, Fraction) for v in vals):
            return sum(vals, Fraction(0))
        return _finite(sum((_to_c(v) for v in vals), complex(0)))
    if tag == "neg":
        return -evaluate(node[1], env)
    if tag == "mul":
        acc = Fraction(1)
        for f in node[1]:
            v = evaluate(f, env)
            if isinstance(acc, Fraction) and isinstance(v, Fraction):
                if max(acc.numerator.bit_length(), v.numerator.bit_length()) > MAX_EXACT_BITS:
                    raise TooBig("too big")
                acc = acc * v
            else:
                acc = _finite(_to_c(acc) * _to_c(v))
        return acc
    if tag == "div":
        a, b = evaluate(node[1], env), evaluate(node[2], env)
        if b == 0:
            raise Undefined("division by zero")
        if isinstance(a, Fraction) and isinstance(b, Fraction):
            return a / b
        return _finite(_to_c(a) / _to_c(b))
    if tag == "pow":
        return _pow(evaluate(node[1], env), evaluate(node[2], env))
    if tag == "root":
        index = Fraction(2) if node[2] is None else evaluate(node[2], env)
        if index == 0:
            raise Undefined("0th root")
        x = evaluate(node[1], env)
        if isinstance(index, Fraction) and index == 2 and isinstance(x, Fraction) and x < 0:
            return complex(0, 1) * _to_c(_pow(-x, Fraction(1, 2)))  # sqrt(-4) = 2i
        return _pow(x, 1 / index if isinstance(index, Fraction) else 1 / _to_c(index))
    if tag == "func":
        return _func(node[1], evaluate(node[2], env))
    if tag == "fact":
        n = evaluate(node[1], env)
        if isinstance(n, Fraction) and n.denominator == 1 and 0 <= n <= MAX_FACTORIAL:
            return Fraction(math.factorial(int(n)))
        if isinstance(n, Fraction) and n.denominator == 1 and n > MAX_FACTORIAL:
            raise TooBig("factorial")
        raise Undefined("factorial")
    if tag == "binom":
        n, k = evaluate(node[1], env), evaluate(node[2], env)
        if all(isinstance(v, Fraction) and v.denominator == 1 for v in (n, k)) and 0 <= n <= 10 * MAX_FACTORIAL:
            return Fraction(math.comb(int(n), int(k))) if k >= 0 else Fraction(0)
        raise Undefined("binom")
    if tag == "pct":
        v = evaluate(node[1], env)
        return v / 100 if isinstance(v, Fraction) else v / 100
    if tag == "mixed":
        whole, frac = evaluate(node[1], env), evaluate(node[2], env)
        return whole + frac
    if tag == "abs":
        v = evaluate(node[1], env)
        return abs(v) if isinstance(v, Fraction) else complex(abs(v))
    raise Undefined(f"not a scalar: {tag}")


_CONST_VALUES = {
    "pi": lambda: complex(math.pi), "e": lambda: complex(math.e), "i": lambda: complex(0, 1),
    "inf": lambda: (_ for _ in ()).throw(Undefined("infinity")),
}


def free_symbols(node, out: set | None = None) -> set:
    out = set() if out is None else out
    if node[0] == "sym":
        out.add(node[1])
    else:
        for child in node[1:]:
            if isinstance(child, tuple):
                if child and isinstance(child[0], str):
                    free_symbols(child, out)
                else:
                    for c in child:
                        if isinstance(c, tuple):
                            free_symbols(c, out)
    return out


def has_decimal(node) -> bool:
    if node[0] == "num":
        return "." in node[1]
    return any(
        has_decimal(c) if c and isinstance(c[0], str) else any(has_decimal(x) for x in c if isinstance(x, tuple))
        for c in node[1:]
        if isinstance(c, tuple)
    )


def _terminates(x: Fraction) -> bool:
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def values_close(a, b, approx: bool) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if a == b:
            return True
        if not approx or (_terminates(a) and _terminates(b)):
            return False
    za, zb = _to_c(a), _to_c(b)
    diff, scale = abs(za - zb), max(abs(za), abs(zb))
    if approx:
        return diff <= APPROX_TOL * max(1.0, scale) and (scale > 1e-4 or diff <= 1e-3 * scale)
    return diff <= REL_TOL * scale or diff <= 1e-12


def _points(names: set, trial: int) -> dict:
    """Deterministic positive rational sample points, the same for both sides."""
    env = {}
    for name in sorted(names):
        h = zlib.crc32(f"{name}|{trial}".encode())
        env[name] = Fraction(h % 89 + 11, h // 89 % 23 + 7)
    return env


def scalars_equal(a, b) -> bool:
    """Numeric equivalence of two scalar ASTs; raises Undecided when it cannot tell."""
    approx = has_decimal(a) or has_decimal(b)
    names = free_symbols(a) | free_symbols(b)
    if len(names) > 12:
        raise Undecided("too many symbols")
    trials = range(TRIALS) if names else range(1)
    decided = too_big = 0
    for t in trials:
        env = _points(names, t)
        try:
            va, vb = evaluate(a, env), evaluate(b, env)
        except TooBig:
            too_big += 1
            continue
        except Undefined:
            continue
        except (OverflowError, ZeroDivisionError, ValueError, MemoryError):
            continue
        try:
            if not values_close(va, vb, approx):
                return False
        except Undefined:
            continue
        decided += 1
    if decided == 0:
        if too_big == len(trials):
            return False  # astronomically large: equal only as identical strings (layer 1)
        raise Undecided("no numeric value")
    return True


# ----------------------------------------------------------------------------- structure

def _is_inf(node) -> int:
    if node == ("const", "inf"):
        return 1
    if node[0] == "neg" and node[1] == ("const", "inf"):
        return -1
    return 0


def _expand_pm(node, limit: int = 8):
    """``a ± b`` -> [a + b, a - b]; any node without ± -> [node]."""
    if node[0] == "pm":
        out = []
        for left in _expand_pm(node[1]):
            for right in _expand_pm(node[2]):
                out += [("add", (left, right)), ("add", (left, ("neg", right)))]
        return out[:limit]
    if node[0] in ("add", "mul") and any(_contains_pm(t) for t in node[1]):
        combos = [[]]
        for t in node[1]:
            combos = [c + [alt] for c in combos for alt in _expand_pm(t)][:limit]
        return [(node[0], tuple(c)) for c in combos]
    if node[0] == "neg" and _contains_pm(node[1]):
        return [("neg", alt) for alt in _expand_pm(node[1])]
    return [node]


def _alternatives(node) -> list:
    """The values a ± answer or a set/list answer stands for."""
    if node[0] in ("set", "list"):
        return [alt for item in node[1] for alt in _expand_pm(item)]
    return _expand_pm(node)


def _contains_pm(node) -> bool:
    if not isinstance(node, tuple) or not node or not isinstance(node[0], str):
        return False
    if node[0] == "pm":
        return True
    return any(_contains_pm(c) if c and isinstance(c[0], str) else any(_contains_pm(x) for x in c)
               for c in node[1:] if isinstance(c, tuple) and c)


def _is_unknown(node) -> bool:
    """The unknown of an inequality: a plain symbol, or a function value (``0 < f(x) < 1``);
    not ``|x|`` or ``\\frac{x}{y}``, whose solution sets are not the interval written."""
    return node[0] == "sym" or _is_application(node)


def _is_name(node) -> bool:
    """A geometric or multi-letter name: ``A``, ``S_1``, ``AB``, ``A_1B_1``, ``NO`` (not ``xy``)."""
    if node[0] == "sym":
        return node[1][:1].isupper()
    if node[0] == "text":
        return node[1].isalpha()
    return node[0] == "mul" and len(node[1]) > 1 and all(_is_name(f) and f[0] == "sym" for f in node[1])


_FUNCTION_LETTERS = frozenset("fghFGHP")


def _is_application(node) -> bool:
    """``f(x)``, ``g(2)``, ``f(x, y)``, ``P(A)``, ``p(x)``: a function at a point (parsed as a product)."""
    if node[0] != "mul" or len(node[1]) != 2 or node[1][0][0] != "sym":
        return False
    fn, arg = node[1][0][1], node[1][1]
    args = arg[1] if arg[0] == "tuple" else (arg,)
    if not all(a[0] == "num" or a[0] == "sym" and a[1] not in _FUNCTION_LETTERS for a in args):
        return False  # "gh" is a product, not g(h)
    return fn in _FUNCTION_LETTERS or fn in ("p", "q") and arg == ("sym", "x")


def _is_label(node) -> bool:
    """Whether a left side names the answer rather than states an equation.

    ``x``, ``a_1``, ``AB``, ``|AB|``, ``\\frac{NO}{BO}``, ``f(x)``, ``(p, q)``, ``S_1:S_2`` are labels;
    ``2x``, ``a + 3z``, ``xy``, ``|x|``, ``\\frac{x}{y}`` are not: those are arithmetic on unknowns
    (Math-Verify's "assignment" rule, plus the names geometry answers use).
    """
    tag = node[0]
    if tag == "sym" or _is_name(node) or _is_application(node):
        return True
    if tag in ("tuple", "ratio"):
        return bool(node[1]) and all(f[0] == "sym" or _is_name(f) for f in node[1])
    if tag == "abs":  # |AB|: a length
        return _is_name(node[1]) and node[1][0] != "sym"
    if tag == "div":  # \frac{NO}{BO}: a ratio of lengths
        return all(_is_name(part) and part[0] != "sym" for part in node[1:])
    return False


def _labels(name, value) -> bool:
    """``name = value`` states the value of ``name``: a label, and (except for ``f(x) = x^2``)
    one that does not occur in the value (``x = 2x - 3`` is an equation)."""
    return _is_label(name) and (_is_application(name) or not free_symbols(name) & free_symbols(value))


def answer_of_equation(node):
    """``x = 3`` / ``x = 1+2 = 3`` / ``x \\approx 3`` -> (x, 3); None when not a chain of equalities.

    The last stated value counts, skipping approximations that follow an exact
    value (Math-Verify: ``x = 1/3 \\approx 0.33`` means 1/3).  The name is None
    when the left side is not a label (``\\frac12 = 0.5``, ``2x + z = 1``).
    """
    if node[0] != "rel" or any(op not in ("=", "~") for op in node[1]):
        return None
    ops, exprs = node[1], node[2]
    last = len(exprs) - 1
    while last > 1 and ops[last - 1] == "~" and not _is_label(exprs[last - 1]):
        last -= 1
    if last == 1 and ops[0] == "~" and not _is_label(exprs[0]):
        return None, exprs[0]  # "\\frac{9.5}{3.14} \\approx 3.01": the exact value is the answer
    for name in (exprs[last - 1], exprs[0]):
        if _labels(name, exprs[last]):
            return name, exprs[last]
    return None, exprs[last]


def _assignments(node):
    """A list of assignments as one labelled equation, so it compares like ``x = 3``.

    ``x=1, x=2`` -> x = [1, 2] (unordered); ``n=1, 2, 3`` -> n = [1, 2, 3];
    ``AB=4, CD=5`` -> (AB, CD) = (4, 5): distinct names fix the order of bare values;
    ``p=5, q=2; p=7, q=2`` -> (p, q) = [(5, 2), (7, 2)]: one tuple per solution.
    Anything else (mixed relations, irregular names) is returned unchanged.
    """
    if node[0] != "list" or not node[1] or node[1][0][0] != "rel":
        return node
    items = node[1]
    pairs = [answer_of_equation(item) for item in items]
    if not pairs[0] or pairs[0][0] is None:
        return node
    if all(item[0] != "rel" for item in items[1:]):  # a label on the first item covers the list
        return ("rel", ("=",), (pairs[0][0], ("list", (pairs[0][1],) + items[1:])))
    if any(not pair or pair[0] is None for pair in pairs):
        return node
    names, values = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    k = names.index(names[0], 1) if names[0] in names[1:] else len(names)
    if len(set(names[:k])) != k or names != names[:k] * (len(names) // k):
        return node
    if k == 1:
        return ("rel", ("=",), (names[0], ("list", tuple(values))))
    rows = tuple(("tuple", tuple(values[i: i + k])) for i in range(0, len(values), k))
    return ("rel", ("=",), (("tuple", tuple(names[:k])), rows[0] if len(rows) == 1 else ("list", rows)))


def _aligned(g_name, p_name, p_value):
    """``p_value`` with its components in the order of ``g_name`` (``CD=5, AB=4`` vs ``AB=4, CD=5``)."""
    if g_name == p_name:
        return p_value
    if g_name[0] != "tuple" or p_name[0] != "tuple" or len(g_name[1]) != len(p_name[1]):
        return None
    if len(set(g_name[1])) != len(g_name[1]) or set(g_name[1]) != set(p_name[1]):
        return None
    order = [p_name[1].index(n) for n in g_name[1]]

    def reorder(row):
        return ("tuple", tuple(row[1][i] for i in order)) if row[0] == "tuple" and len(row[1]) == len(order) else row

    if p_value[0] == "list":
        return ("list", tuple(reorder(row) for row in p_value[1]))
    return reorder(p_value)


def _relation(node):
    """A single (in)equality as (op, f) meaning ``f op 0``, with < and <= only."""
    if node[0] != "rel" or len(node[1]) != 1:
        return None
    op = node[1][0]
    lhs, rhs = node[2]
    diff = ("add", (lhs, ("neg", rhs)))
    flipped = ("add", (rhs, ("neg", lhs)))
    return {"<": ("<", diff), "<=": ("<=", diff), ">": ("<", flipped), ">=": ("<=", flipped),
            "=": ("=", diff), "!=": ("!=", diff), "~": ("=", diff)}.get(op)


def _interval_of_chain(node):
    """``a <= x < b`` -> interval [a, b); ``x \\in S`` -> S."""
    if node[0] != "rel":
        return None
    ops, exprs = node[1], node[2]
    if ops == ("in",) and _is_unknown(exprs[0]):
        return exprs[1]
    if len(ops) == 2 and _is_unknown(exprs[1]) and all(o in ("<", "<=") for o in ops):
        return ("interval", exprs[0], exprs[2], ops[0] == "<=", ops[1] == "<=")
    if len(ops) == 2 and _is_unknown(exprs[1]) and all(o in (">", ">=") for o in ops):
        return ("interval", exprs[2], exprs[0], ops[1] == ">=", ops[0] == ">=")
    return None


def _proportional(f, g, positive: bool) -> bool:
    """f == c * g for a constant c (> 0 when ``positive``), tested at sample points."""
    names = free_symbols(f) | free_symbols(g)
    ratio = None
    decided = 0
    for t in range(TRIALS + 1):
        env = _points(names, t)
        try:
            vf, vg = evaluate(f, env), evaluate(g, env)
        except Undefined:
            continue
        if vg == 0 or vf == 0:
            if (vg == 0) != (vf == 0):
                return False
            continue
        r = vf / vg if isinstance(vf, Fraction) and isinstance(vg, Fraction) else _to_c(vf) / _to_c(vg)
        if ratio is None:
            ratio = r
            if positive and _to_c(r).real <= 0:
                return False
        elif not values_close(ratio, r, False):
            return False
        decided += 1
    if decided == 0:
        raise Undecided("equation")
    return True


_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}
_INF = ("const", "inf")


def _inequality_set(node):
    """(name, solution set) of one inequality in one unknown: ``x > 2`` -> (x, (2, oo)),
    ``x \\ne 3`` -> (x, (-oo, 3) U (3, oo)), ``a <= x < b`` -> (x, [a, b)); None otherwise.
    The unknown is a plain symbol or ``f(x)``: ``|x| < 2`` or ``\\frac{x}{y} > 2`` is not an interval."""
    if node[0] != "rel":
        return None
    chain = _interval_of_chain(node)
    if chain is not None:
        return node[2][0 if node[1] == ("in",) else 1], chain
    if len(node[1]) != 1 or node[1][0] not in _FLIPPED:
        return None
    op, (lhs, rhs) = node[1][0], node[2]
    if not _is_unknown(lhs):  # "2 < x" is "x > 2"
        op, lhs, rhs = _FLIPPED[op], rhs, lhs
    if not _is_unknown(lhs) or free_symbols(rhs):
        return None
    below, above = ("interval", ("neg", _INF), rhs, False, op == "<="), ("interval", rhs, _INF, op == ">=", False)
    solution = {"<": below, "<=": below, ">": above, ">=": above, "!=": ("union", (below, above))}[op]
    return lhs, solution


def _bound(node) -> float | None:
    if _is_inf(node):
        return _is_inf(node) * math.inf
    try:
        z = _to_c(evaluate(node, {}))
    except (Undefined, ArithmeticError, ValueError):
        return None
    return z.real if z.imag == 0 else None


def _as_set(node):
    """The solution set an inequality, or a list of them in one unknown, describes; None otherwise.

    "and" and "or" both read as a list separator here, so a list is taken as a union only
    when its pieces are disjoint: an intersection such as "x > -1 and x < 3" is left alone.
    """
    if node[0] == "rel":
        found = _inequality_set(node)
        return found[1] if found else None
    if node[0] != "list" or len(node[1]) > MAX_ITEMS:
        return None
    found = [_inequality_set(item) for item in node[1]]
    if not all(found) or len({name for name, _ in found}) != 1:
        return None
    pieces = [piece for _, s in found for piece in (s[1] if s[0] == "union" else (s,))]
    if any(piece[0] != "interval" for piece in pieces):
        return None
    spans = [(_bound(piece[1]), _bound(piece[2]), piece) for piece in pieces]
    if any(lo is None or hi is None for lo, hi, _ in spans):
        return None
    spans.sort(key=lambda span: span[0])
    for (_, hi, a), (lo, _, b) in zip(spans, spans[1:]):
        if hi > lo or hi == lo and a[4] and b[3]:  # overlapping pieces: not a union
            return None
    return ("union", tuple(pieces))


def _set_like(node) -> bool:
    return node[0] in ("interval", "union") or node[0] == "tuple" and len(node[1]) == 2


MAX_MATRIX = 6  # rows/columns of a matrix in arithmetic
MAX_MATMULS = 2  # matrix products per answer (A B C, A^3): each one grows the entry trees
_ARITHMETIC = ("add", "mul", "neg", "div", "pow")


def _has_matrix(node) -> bool:
    tag = node[0]
    if tag == "matrix":
        return True
    if tag in ("add", "mul"):
        return any(_has_matrix(t) for t in node[1])
    if tag == "neg":
        return _has_matrix(node[1])
    return tag in ("div", "pow") and _has_matrix(node[1])


def _matrix_expr(node):
    """Sums, scalar multiples, products and small powers of matrices as one ("matrix", rows)
    whose entries are expression trees; None when ``node`` is not such an expression."""
    if node[0] not in _ARITHMETIC or not _has_matrix(node):
        return None
    rows = _matrix_rows(node, matmuls=[0])
    return None if rows is None else ("matrix", rows)


def _matrix_rows(node, matmuls: list):
    """The entry rows of a matrix expression; ``matmuls[0]`` counts the products made so far."""
    tag = node[0]
    if tag == "matrix":
        rows = node[1]
        if not rows or len(rows) > MAX_MATRIX or any(len(r) != len(rows[0]) or len(r) > MAX_MATRIX for r in rows):
            return None
        return rows
    if not _has_matrix(node):
        return None  # a scalar where a matrix is needed ("A + 2" is not defined)
    if tag == "neg":
        m = _matrix_rows(node[1], matmuls)
        return None if m is None else tuple(tuple(("neg", e) for e in row) for row in m)
    if tag == "add":
        terms = [_matrix_rows(t, matmuls) for t in node[1]]
        if any(m is None or _dims(m) != _dims(terms[0]) for m in terms):
            return None
        return tuple(tuple(("add", cells) for cells in zip(*rows)) for rows in zip(*terms))
    if tag == "mul":  # scalars commute; matrices multiply in the order written
        acc, scalars = None, []
        for f in node[1]:
            if not _has_matrix(f):
                scalars.append(f)
                continue
            m = _matrix_rows(f, matmuls)
            if m is not None and acc is not None:
                m = _matmul(acc, m, matmuls)
            if m is None:
                return None
            acc = m
        return tuple(tuple(("mul", (*scalars, e)) for e in row) for row in acc) if scalars else acc
    if tag == "div" and not _has_matrix(node[2]):
        m = _matrix_rows(node[1], matmuls)
        return None if m is None else tuple(tuple(("div", e, node[2]) for e in row) for row in m)
    if tag == "pow" and node[2] in (("num", "2"), ("num", "3")):
        m = acc = _matrix_rows(node[1], matmuls)
        for _ in range(int(node[2][1]) - 1):
            acc = None if acc is None else _matmul(acc, m, matmuls)
        return acc
    return None


def _dims(rows) -> tuple[int, int]:
    return len(rows), len(rows[0])


def _matmul(a, b, matmuls: list):
    # Each product turns an entry into a sum of products: allow few, of numeric matrices only,
    # so that entries stay cheap to evaluate and never need the symbolic layer.
    matmuls[0] += 1
    if matmuls[0] > MAX_MATMULS or _dims(a)[1] != _dims(b)[0]:
        return None
    if any(free_symbols(e) for m in (a, b) for row in m for e in row):
        return None
    return tuple(tuple(("add", tuple(("mul", (row[k], b[k][j])) for k in range(len(row))))
                       for j in range(len(b[0]))) for row in a)


def _is_zero(node) -> bool:
    """Whether a constant term is 0 (``9:00`` must not become 9/0)."""
    if free_symbols(node):
        return False
    try:
        return evaluate(node, {}) == 0
    except (Undefined, ArithmeticError, ValueError):
        return False


def _as_fraction(node):
    """``a:b`` as ``a/b``; other nodes unchanged; None for ``a:b:c`` and a ratio with a zero term."""
    if node[0] != "ratio":
        return node
    if len(node[1]) != 2 or any(_is_zero(term) for term in node[1]):
        return None
    return ("div", *node[1])


def _text_key(node) -> str:
    return "".join(str(node[1]).lower().split()).strip(".")


def equivalent(g, p, symbolic=None) -> bool:
    """Is prediction tree ``p`` mathematically the gold tree ``g``?

    ``symbolic(g, p)`` is consulted for scalar pairs the numeric layer cannot settle.
    """
    return _Comparer(symbolic).eq(g, p, 0)


class _Comparer:
    def __init__(self, symbolic):
        self.symbolic = symbolic

    def eq(self, g, p, depth: int) -> bool:
        if g == p:
            return True
        if depth > 12:
            return False
        d = depth + 1
        # Equations: "x = 3" answers "3"; both sides equations compare as equations.
        # The value after the last "=" answers a plain expression ("$5 \\times 6 = 30$" answers 30),
        # but a gold equation only reduces to its value when its left side is a label (x, AB, f(x), (p,q)).
        g, p = _assignments(g), _assignments(p)
        g_ans, p_ans = answer_of_equation(g), answer_of_equation(p)
        if g_ans and p_ans and g_ans[0] is not None and p_ans[0] is not None:
            p_value = _aligned(g_ans[0], p_ans[0], p_ans[1])
            if p_value is not None:
                return self.eq(g_ans[1], p_value, d)
        if g_ans and g_ans[0] is not None and p[0] != "rel":
            return self.eq(g_ans[1], p, d)
        if p_ans and p_ans[0] is not None and g[0] != "rel":
            return self.eq(g, p_ans[1], d)
        if p_ans and p_ans[0] is None and g[0] != "rel" and not (g_ans and g_ans[0] is None):
            return self.eq(g, p_ans[1], d)
        if g_ans and g_ans[0] is None and p[0] != "rel":
            return self.eq(g_ans[1], p, d) if g[1] == ("~",) else False
        # Inequalities against intervals: "x > 2" is (2, oo), "x <= -1 or x > 3" a union.
        if _set_like(g) or _set_like(p):
            g_set, p_set = _as_set(g), _as_set(p)
            if g_set is not None or p_set is not None:
                return self.eq(g_set or g, p_set or p, d)
        if g[0] == "rel" or p[0] == "rel":
            return self.relations(g, p, d)
        # ± answers are the set of both values.
        if _contains_pm(g) or _contains_pm(p):
            gs, ps = _alternatives(g), _alternatives(p)
            if len(gs) > 1 or len(ps) > 1:
                return self.unordered(gs, ps, d)
        # Percentages: "28\%" answers 28 and 0.28.
        if g[0] == "pct" or p[0] == "pct":
            return self.percent(g, p, d)
        return self.structures(g, p, d)

    def percent(self, g, p, d) -> bool:
        g_in = g[1] if g[0] == "pct" else g
        p_in = p[1] if p[0] == "pct" else p
        if self.eq(g_in, p_in, d):
            return True
        return g[0] != p[0] and self.scalar(g, p)

    def relations(self, g, p, d) -> bool:
        gi, pi = _interval_of_chain(g), _interval_of_chain(p)
        if gi is not None or pi is not None:
            return self.eq(g if gi is None else gi, p if pi is None else pi, d)
        gr, pr = _relation(g), _relation(p)
        if gr and pr:
            if gr[0] != pr[0]:
                return False
            try:
                return _proportional(gr[1], pr[1], positive=gr[0] in ("<", "<="))
            except Undecided:
                return False
        if g[0] == "rel" and p[0] == "rel" and g[1] == p[1] and len(g[2]) == len(p[2]):
            return all(self.eq(a, b, d) for a, b in zip(g[2], p[2]))
        if g[0] == "rel" and p[0] == "rel" and set(g[1]) <= {"=", "~"} and set(p[1]) <= {"=", "~"}:
            gf = ("add", (g[2][0], ("neg", g[2][-1])))
            pf = ("add", (p[2][0], ("neg", p[2][-1])))
            try:
                return _proportional(gf, pf, positive=False)
            except Undecided:
                return False
        return False

    def unordered(self, gs, ps, d) -> bool:
        if len(gs) != len(ps) or len(gs) > MAX_ITEMS:
            return False
        used = [False] * len(ps)
        for a in gs:
            for j, b in enumerate(ps):
                if not used[j] and self.eq(a, b, d):
                    used[j] = True
                    break
            else:
                return False
        return True

    def structures(self, g, p, d) -> bool:
        gt, pt = g[0], p[0]
        # Matrix arithmetic ("2\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}") compares by its entries.
        g_mat, p_mat = _matrix_expr(g), _matrix_expr(p)
        if g_mat is not None or p_mat is not None:
            return self.eq(g_mat or g, p_mat or p, d)
        collections = ("set", "list")
        if gt in collections and pt in collections:
            # A solution the response lists twice is still one solution, unless the gold itself
            # repeats values: then both are multisets ("2, 2, 3" is neither "2, 3" nor "2, 3, 3").
            gs, ps = g[1], p[1]
            if len(set(gs)) == len(gs):
                ps = tuple(dict.fromkeys(ps))
            return self.unordered(gs, ps, d)
        if gt in collections and len(g[1]) == 1:
            return self.eq(g[1][0], p, d)
        if pt in collections and len(p[1]) == 1:
            return self.eq(g, p[1][0], d)
        if gt == "clock" or pt == "clock":
            return self.clock(g, p, d)
        if gt == "ratio" or pt == "ratio":
            return self.ratio(g, p, d)
        if gt == "tuple" and pt in collections or gt in collections and pt == "tuple":
            return self.ordered(g[1], p[1], d)  # a tuple answer fixes the order
        if gt == "tuple" and pt == "tuple":
            return self.ordered(g[1], p[1], d)
        if gt == "union" and pt == "union":
            return self.unordered(g[1], p[1], d)
        if "interval" in (gt, pt):
            return self.interval(g, p, d)
        if gt == "matrix" and pt == "matrix":
            return len(g[1]) == len(p[1]) and all(self.ordered(a, b, d) for a, b in zip(g[1], p[1]))
        if gt == "matrix" and pt == "tuple" or gt == "tuple" and pt == "matrix":
            m, t = (g, p) if gt == "matrix" else (p, g)
            column = tuple(row[0] for row in m[1] if len(row) == 1)
            return len(column) == len(m[1]) and self.ordered(column, t[1], d)
        if gt == "text" or pt == "text":
            return gt in ("text", "sym") and pt in ("text", "sym") and _text_key(g) == _text_key(p)
        if gt == "base" or pt == "base":
            return gt == pt and g[1].lstrip("0") == p[1].lstrip("0") and g[2] == p[2]
        if gt in _CONTAINERS or pt in _CONTAINERS:
            return False
        return self.scalar(g, p)

    def ratio(self, g, p, d) -> bool:
        """``7:32`` is ``\\frac{7}{32}``; two ratios compare term by term (``12:00`` is not ``1:00``)."""
        if g[0] == p[0]:
            return self.ordered(g[1], p[1], d)
        g, p = _as_fraction(g), _as_fraction(p)
        if g is None or p is None or g[0] in _CONTAINERS or p[0] in _CONTAINERS:
            return False
        return self.eq(g, p, d)

    def clock(self, g, p, d) -> bool:
        """A time of day compares term by term, with a ratio or a time (``5:00 PM`` is not
        ``5:00 AM``); it is never a fraction (``12:30`` is not 0.4, ``9:00`` not 9/0)."""
        if g[0] == p[0] == "clock" and g[2] and p[2] and g[2] != p[2]:
            return False
        if g[0] not in ("clock", "ratio") or p[0] not in ("clock", "ratio"):
            return False
        return self.ordered(g[1], p[1], d)

    def ordered(self, gs, ps, d) -> bool:
        return len(gs) == len(ps) and all(self.eq(a, b, d) for a, b in zip(gs, ps))

    def interval(self, g, p, d) -> bool:
        def ends(node):
            if node[0] == "interval":
                return node[1], node[2], node[3], node[4]
            if node[0] == "tuple" and len(node[1]) == 2:  # "(a, b)" may be an open interval
                return node[1][0], node[1][1], False, False
            return None

        ge, pe = ends(g), ends(p)
        if ge is None or pe is None or ge[2:] != pe[2:]:
            return False
        return self.bound(ge[0], pe[0], d) and self.bound(ge[1], pe[1], d)

    def bound(self, a, b, d) -> bool:
        ia, ib = _is_inf(a), _is_inf(b)
        if ia or ib:
            return ia == ib
        return self.eq(a, b, d)

    def scalar(self, g, p) -> bool:
        if _is_inf(g) or _is_inf(p):
            return _is_inf(g) == _is_inf(p)
        try:
            return scalars_equal(g, p)
        except Undecided:
            if self.symbolic is None:
                return False
            return bool(self.symbolic(g, p))


_CONTAINERS = {"set", "list", "tuple", "union", "interval", "matrix", "ellipsis", "rel", "ratio", "clock"}
