"""The judge's wire format and handles (rlvr/rewards/sandbox_rpc.py), without a sandbox: pure functions only."""

import ast
import collections
import enum
import math

import pytest

from rlvr.rewards.sandbox_rpc import (
    Channel,
    Remote,
    RemoteError,
    _free_names,
    _module_like,
    _TestNamespace,
    decode,
    encode,
)


def _no_refs(obj):
    raise AssertionError(f"unexpected ref for {obj!r}")


PLAIN = [
    None,
    True,
    False,
    0,
    -7,
    2**200,
    -(2**70),
    1.5,
    float("inf"),
    float("-inf"),
    "",
    "ünï",
    b"\x00\xff",
    3 + 4j,
    [1, [2, [3]]],
    (1, "a"),
    {1, 2},
    frozenset({"x"}),
    {"k": [1, (2,)], 3: None, (1, 2): {4}},
]


@pytest.mark.parametrize("value", PLAIN, ids=[repr(v)[:20] for v in PLAIN])
def test_plain_values_round_trip_exactly(value):
    back = decode(encode(value, _no_refs), _no_refs)
    assert back == value and type(back) is type(value)


def test_nan_round_trips():
    assert math.isnan(decode(encode(float("nan"), _no_refs), _no_refs))


def test_anything_not_exactly_plain_becomes_a_ref():
    class Int(int):
        pass

    class L(list):
        pass

    refs = []
    enc = encode([Int(3), L([1]), True, object()], lambda o: refs.append(o) or len(refs) - 1)
    assert enc == [{"ref": 0}, {"ref": 1}, True, {"ref": 2}] and type(refs[0]) is Int


class _Liar(int):
    """An int subclass whose own methods lie: the copy must come from int's code, not these."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__

    def __int__(self):
        return 99

    __index__ = __int__


class _LyingStr(str):
    def __str__(self):
        return "lie"

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class _LyingList(list):
    def __iter__(self):
        return iter([99])


class _Color(enum.IntEnum):
    RED = 3


SUBCLASSED = [
    (collections.Counter("aab"), {"a": 2, "b": 1}),
    (collections.defaultdict(list, {1: [2]}), {1: [2]}),
    (collections.OrderedDict([(2, "b"), (1, "a")]), {2: "b", 1: "a"}),
    (collections.deque([1, 2]), [1, 2]),
    (_Color.RED, 3),
    (_Liar(5), 5),
    (_LyingStr("ab"), "ab"),
    (_LyingList([1, 2]), [1, 2]),
    (type("F", (float,), {})(1.5), 1.5),
    (type("B", (bytes,), {})(b"\x01"), b"\x01"),
    ([_Liar(1), {_LyingStr("k"): (_Color.RED,)}], [1, {"k": (3,)}]),
]


@pytest.mark.parametrize("value,plain", SUBCLASSED, ids=[type(v).__name__ for v, _ in SUBCLASSED])
def test_child_sends_subclasses_of_plain_types_as_plain_copies(value, plain):
    back = decode(encode(value, _no_refs, subclasses=True), _no_refs)
    assert back == plain and type(back) is type(plain)
    assert _exact_types(back)


def test_namedtuples_arrive_as_the_judges_own_namedtuples():
    class Lying(collections.namedtuple("P", "x y")):
        def __eq__(self, other):
            return True

        __hash__ = tuple.__hash__

    for value in (collections.namedtuple("P", "x y")(1, [2]), Lying(1, [2])):
        back = decode(encode(value, _no_refs, subclasses=True), _no_refs)
        assert back == (1, [2]) and back.x == 1 and back.y == [2] and back._fields == ("x", "y")
        assert type(back).__eq__ is tuple.__eq__ and type(back).__module__ != Lying.__module__
        assert decode(encode(back, _no_refs), _no_refs) == back  # the judge can pass it back to the program
    odd = type("Odd", (tuple,), {"_fields": ("a", "class")})((1, 2))  # fields no namedtuple may have
    back = decode(encode(odd, _no_refs, subclasses=True), _no_refs)
    assert back == (1, 2) and type(back) is tuple


def _exact_types(x):
    if type(x) in (list, tuple, set, frozenset):
        return all(map(_exact_types, x))
    if type(x) is dict:
        return all(_exact_types(k) and _exact_types(v) for k, v in x.items())
    return type(x) in (type(None), bool, int, float, str, bytes, complex)


@pytest.mark.parametrize(
    "bad",
    [
        {"tuple": [1], "set": [1]},
        {"eval": "1"},
        {"int": 5},
        {"float": "1e9"},
        {"dict": [[1]]},
        {"complex": ["a", 1]},
        {"ref": "0"},
        {"bytes": "zz"},
        {"set": [[1]]},
        {"namedtuple": [["_x"], [1]]},
        {"namedtuple": [["a", "a"], [1, 2]]},
        {"namedtuple": [["def"], [1]]},
        {"namedtuple": [["a=1"], [1]]},
        {"namedtuple": [["a"], [1, 2]]},
        {"namedtuple": [[1], [1]]},
    ],
)
def test_decode_rejects_what_encode_cannot_produce(bad):
    with pytest.raises((ValueError, TypeError)):
        decode(bad, lambda n: n)


def test_deep_nesting_is_refused():
    x = []
    for _ in range(1000):
        x = [x]
    with pytest.raises(ValueError):
        encode(x, _no_refs)


def test_remote_handles_refuse_comparisons_and_membership():
    handle = Remote(channel=None, ref=0)
    for compare in (
        lambda: handle == 3,
        lambda: handle != 3,
        lambda: 3 == handle,
        lambda: handle < 1,
        lambda: 1 in handle,
        lambda: handle in [1, 2],
    ):
        with pytest.raises(TypeError):
            compare()
    assert handle is not None and {handle: 1}[handle] == 1  # identity and hashing still work
    assert handle in [handle]  # identity short-cut, no comparison asked of the program
    assert issubclass(RemoteError, Exception)


def test_module_like_names_are_attribute_bases_never_called():
    tree = ast.parse("assert math.isclose(f(x), 1)\nassert copy(y) == copy.z\nimport os\nos.getcwd()")
    assert _module_like(tree) == {"math", "os"}


def _namespace(test: str, names: dict) -> _TestNamespace:
    tree = ast.parse(test)
    return _TestNamespace(Channel(-1, -1, deadline=0.0), names, _module_like(tree), _free_names(tree))


def test_free_names_leave_out_what_the_test_binds():
    tree = ast.parse(
        "def check(candidate):\n    assert candidate(2) == f(2)\nimport math as m\nx = 1\n"
        "for i in range(x):\n    check(pow)\ntry:\n    g()\nexcept ValueError as e:\n    print(e, m)"
    )
    assert _free_names(tree) == {"f", "range", "pow", "g", "ValueError", "print"}


def test_a_builtin_named_task_function_is_the_programs():
    ns = _namespace("assert pow(2, 3) == 8", {"pow": {"ref": 0}})
    assert type(ns["pow"]) is Remote  # not the builtin, which would pass any program
    ns = _namespace("def check(candidate):\n    assert candidate(2, 3) == 8\ncheck(pow)", {"pow": {"ref": 0}})
    assert type(ns["pow"]) is Remote


def test_builtins_beside_the_tested_function_stay_real():
    names = {"abs": {"ref": 0}, "add": {"ref": 1}, "sorted": {"ref": 2}}
    ns = _namespace("assert abs(add(1, 2) - 3) < 1e-9 and sorted([add(0, 1)]) == [1]", names)
    assert "abs" not in ns and "sorted" not in ns and type(ns["add"]) is Remote
    # a name the test binds itself is no subject: the program cannot make `pow` a helper by defining `x`
    ns = _namespace("x = pow(2, 3)\nassert x == 8", {"pow": {"ref": 0}, "x": {"ref": 1}})
    assert type(ns["pow"]) is Remote


def test_the_program_cannot_choose_the_module():
    ns = _namespace("assert m.isclose(f(), 1)", {"m": {"ref": 0, "module": "math"}, "f": {"ref": 1}})
    assert type(ns["m"]) is Remote  # not a stdlib name: the program's object, not a module it names
    ns = _namespace("assert math.isclose(f(), 1)", {"math": {"ref": 0, "module": "os"}, "f": {"ref": 1}})
    assert ns["math"] is math
