"""Equivalence of two parsed answers, in cheap layers.

1. identical canonical strings / identical trees;
2. structure (tuples ordered; sets, bare lists and unions order-insensitive;
   intervals, matrices, equations ``x=3`` vs ``3``, inequalities, ``±``,
   percentages) down to scalars;
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


def _is_symbol(node) -> bool:
    return node[0] == "sym"


def answer_of_equation(node):
    """``x = 3`` / ``x = 1+2 = 3`` / ``x \\approx 3`` -> (x, 3); None when not a chain of equalities.

    The last stated value counts, skipping approximations that follow an exact
    value (Math-Verify: ``x = 1/3 \\approx 0.33`` means 1/3).  The name is None
    when the left side is not a lone symbol (``\\frac12 = 0.5``).
    """
    if node[0] != "rel" or any(op not in ("=", "~") for op in node[1]):
        return None
    ops, exprs = node[1], node[2]
    last = len(exprs) - 1
    while last > 1 and ops[last - 1] == "~" and not _is_symbol(exprs[last - 1]):
        last -= 1
    if last == 1 and ops[0] == "~" and not _is_symbol(exprs[0]):
        return None, exprs[0]  # "\\frac{9.5}{3.14} \\approx 3.01": the exact value is the answer
    for name in (exprs[last - 1], exprs[0]):
        if _is_symbol(name):
            return name, exprs[last]
    return None, exprs[last]


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
    if ops == ("in",) and _is_symbol(exprs[0]):
        return exprs[1]
    if len(ops) == 2 and _is_symbol(exprs[1]) and all(o in ("<", "<=") for o in ops):
        return ("interval", exprs[0], exprs[2], ops[0] == "<=", ops[1] == "<=")
    if len(ops) == 2 and _is_symbol(exprs[1]) and all(o in (">", ">=") for o in ops):
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
        # but a gold equation only reduces to its value when its left side is a lone variable.
        g_ans, p_ans = answer_of_equation(g), answer_of_equation(p)
        if g_ans and p_ans and g_ans[0] is not None and g_ans[0] == p_ans[0]:
            return self.eq(g_ans[1], p_ans[1], d)
        if g_ans and g_ans[0] is not None and p[0] != "rel":
            return self.eq(g_ans[1], p, d)
        if p_ans and p_ans[0] is not None and g[0] != "rel":
            return self.eq(g, p_ans[1], d)
        if p_ans and p_ans[0] is None and g[0] != "rel" and not (g_ans and g_ans[0] is None):
            return self.eq(g, p_ans[1], d)
        if g_ans and g_ans[0] is None and p[0] != "rel":
            return self.eq(g_ans[1], p, d) if g[1] == ("~",) else False
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
        collections = ("set", "list")
        if gt in collections and pt in collections:
            return self.unordered(g[1], p[1], d)
        if gt in collections and len(g[1]) == 1:
            return self.eq(g[1][0], p, d)
        if pt in collections and len(p[1]) == 1:
            return self.eq(g, p[1][0], d)
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


_CONTAINERS = {"set", "list", "tuple", "union", "interval", "matrix", "ellipsis", "rel"}
