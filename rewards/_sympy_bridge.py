"""The symbolic layer: AST -> sympy by direct construction, then ``simplify``.

Model text never reaches ``sympify``/``parse_expr``/``eval``: the tree from
``rewards._latex`` is rebuilt with sympy constructors.  Powers whose result
would be astronomically large are refused before sympy sees them (sympy
evaluates ``Integer**Integer`` eagerly).  ``simplify`` itself has no time bound,
so callers run ``symbolic_equal`` in a worker process under a hard timeout
(``rewards._pool``).
"""

from __future__ import annotations

from fractions import Fraction

MAX_POW_BITS = 20_000


class Refused(ValueError):
    pass


_CONVERTIBLE = {"num", "sym", "const", "add", "neg", "mul", "div", "pow", "root", "func", "fact", "pct",
                "mixed", "abs", "binom"}
_FUNC_NAMES = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
               "ln", "log", "exp", "floor", "ceil"}


def convertible(node) -> bool:
    """Whether ``to_sympy`` can build this tree (checked in the parent, without sympy)."""
    tag = node[0]
    if tag not in _CONVERTIBLE or (tag == "func" and node[1] not in _FUNC_NAMES):
        return False
    for child in node[1:]:
        if isinstance(child, tuple) and child:
            if isinstance(child[0], str):
                if not convertible(child):
                    return False
            elif not all(convertible(c) for c in child if isinstance(c, tuple)):
                return False
    return True


def to_sympy(node):
    import sympy as sp

    tag = node[0]
    if tag == "num":
        f = Fraction(node[1])
        return sp.Rational(f.numerator, f.denominator)
    if tag == "sym":
        return sp.Symbol(node[1])
    if tag == "const":
        return {"pi": sp.pi, "e": sp.E, "i": sp.I, "inf": sp.oo}[node[1]]
    if tag == "add":
        return sp.Add(*[to_sympy(t) for t in node[1]])
    if tag == "neg":
        return -to_sympy(node[1])
    if tag == "mul":
        return sp.Mul(*[to_sympy(t) for t in node[1]])
    if tag == "div":
        return sp.Mul(to_sympy(node[1]), sp.Pow(to_sympy(node[2]), -1))
    if tag == "pow":
        base, exp = to_sympy(node[1]), to_sympy(node[2])
        _check_pow(base, exp)
        return sp.Pow(base, exp)
    if tag == "root":
        index = sp.Integer(2) if node[2] is None else to_sympy(node[2])
        return sp.Pow(to_sympy(node[1]), 1 / index)
    if tag == "func":
        fn = {"sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "sec": sp.sec, "csc": sp.csc, "cot": sp.cot,
              "arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan, "sinh": sp.sinh, "cosh": sp.cosh,
              "tanh": sp.tanh, "ln": sp.log, "log": sp.log, "exp": sp.exp, "floor": sp.floor,
              "ceil": sp.ceiling}.get(node[1])
        if fn is None:
            raise Refused(node[1])
        return fn(to_sympy(node[2]))
    if tag == "fact":
        arg = to_sympy(node[1])
        if arg.is_Integer and arg > 5000:
            raise Refused("factorial too big")
        return sp.factorial(arg)
    if tag == "pct":
        return to_sympy(node[1]) / 100
    if tag == "mixed":
        return to_sympy(node[1]) + to_sympy(node[2])
    if tag == "abs":
        return sp.Abs(to_sympy(node[1]))
    if tag == "binom":
        return sp.binomial(to_sympy(node[1]), to_sympy(node[2]))
    raise Refused(tag)


def _check_pow(base, exp) -> None:
    if base.is_Number and exp.is_Number and exp.is_Integer:
        bits = max(abs(base.p).bit_length(), abs(base.q).bit_length()) if base.is_Rational else 64
        if abs(int(exp)) * bits > MAX_POW_BITS:
            raise Refused("power too big")
    if exp.is_Number and abs(exp) > 10**6:
        raise Refused("exponent too big")


def symbolic_equal(g, p) -> bool:
    """``simplify(g - p) == 0`` on the sympy forms; False when either side cannot be built."""
    import sympy as sp

    try:
        a, b = to_sympy(g), to_sympy(p)
    except (Refused, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
        return False
    if a.has(sp.oo, -sp.oo, sp.zoo, sp.nan) or b.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
        return a == b
    diff = sp.simplify(a - b)
    return bool(diff == 0)
