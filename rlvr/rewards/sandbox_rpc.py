"""Assert tests without trusting the program: the test code runs in a judge process, the program in a child.

Run as a script (`python -I -S -c <this file> MODE PROGRAM_FD [REQUEST_FD REPLY_FD]`) this is the untrusted
side: it executes the program as `__main__` (MODE "stdio": that is all) and, in MODE "rpc", then answers the
judge's requests about the program's objects (call, attribute, item, len, iteration, bool, str). Loaded by
sandbox_launcher.py it is the trusted side: `run_assert_test` executes one assert test, in the judge the
launcher forks for it, in a fresh namespace where every name the program defined is a `Remote` handle (or its
plain value, fetched); the judge sends the launcher one verdict byte over a pipe only it holds.

Invariants (why a wrong program cannot pass):
- Only plain data crosses back: None, bool, int, float, str, bytes, complex, and list, tuple, set, frozenset,
  dict of those, each checked by exact type in the judge; anything else (an object whose __eq__ says True)
  arrives as a `Remote` handle, which refuses ==, <, hash-free comparisons and `in`. The child sends an
  instance of a subclass of those types (Counter, OrderedDict, IntEnum, a str subclass) or a deque as its plain
  copy, read through the base type's code: overridden __eq__ or __hash__ never reach the judge. A namedtuple
  arrives as an instance of a namedtuple class the judge makes itself with the same field names (checked
  identifiers; tuple's own __eq__ and __hash__), so `p.x` works in a test.
- The verdict is whether the trusted test code raised; it is computed in the judge with its own builtins.
  The program never holds the tests, the verdict pipe, or a way into the judge's or the launcher's memory.
- Names resolve as in plain Python (the program's, else the builtin), with two exceptions. A program name that
  is a builtin's stands for the program only in a test whose other free program names are builtins' too (the
  task's function is `pow`): next to the function it checks (`add`), a test's `abs`, `len` or `sorted` is the
  real one, so a program `abs` cannot change what the test computes. A name the test uses as `name.attr`
  (never calls) that is a standard-library module's name is the judge's own import of that module, whatever
  the program bound to it (a fake `math.isclose` cannot answer; a program function named `copy` stays the
  program's); which module is decided by the name alone, never by the child.
- Whatever the child sends (garbage, nothing, an early exit, a lie) can only make a call fail or return a
  value the program could have returned itself.
- The program's builtin exceptions reach the test as themselves (a test may expect a ValueError), except
  StopIteration and StopAsyncIteration, which arrive as RuntimeError: they are control flow, and raised inside a
  test's `map`/`filter` they would end it early (`all(map(is_prime, primes))` true for any program).
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import json
import os
import select
import sys
import time
import types
from typing import Any, Callable

MAX_MESSAGE_BYTES = 16 << 20
MAX_DEPTH = 200
_PLAIN_SCALARS = (type(None), bool, int, float, str)
_PLAIN_TYPES = (*_PLAIN_SCALARS, list, tuple, set, frozenset, dict, bytes, complex)
_NOT_PLAIN = object()
# Standard-library modules the judge imports itself when the program binds their name (import side effects)
_UNTRUSTED_STDLIB = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser"})


class RemoteError(Exception):
    """The program's side failed to answer (exited, timed out, sent garbage) or raised a non-builtin error."""


def _plain_copy(x: Any) -> Any:
    """`x`, an instance of a subclass of a plain type (or a deque), as that plain type: read through the base type's
    own C code (`int.__int__`, `list.__iter__`, ...), never through methods the subclass overrides."""
    t = type(x)
    if issubclass(t, int):  # bool cannot be subclassed; IntEnum, IntFlag and other int subclasses land here
        return int.__int__(x)
    if issubclass(t, float):
        return float.__float__(x)
    if issubclass(t, str):
        return str.__str__(x)
    if issubclass(t, bytes):
        return bytes.fromhex(bytes.hex(x))
    if issubclass(t, complex):
        return complex(complex.real.__get__(x), complex.imag.__get__(x))
    if issubclass(t, dict):  # Counter, defaultdict, OrderedDict
        return dict(dict.items(x))
    for base in (list, tuple, set, frozenset):
        if issubclass(t, base):
            return base(base.__iter__(x))
    if issubclass(t, collections.deque):
        return list(collections.deque.__iter__(x))
    return _NOT_PLAIN


def _namedtuple_fields(t: type, x: tuple) -> tuple[str, ...] | None:
    """The field names of a namedtuple class (read in the child: the program's class), None if not one."""
    fields = getattr(t, "_fields", None)
    if type(fields) is not tuple or len(fields) != tuple.__len__(x) or not all(type(f) is str for f in fields):
        return None
    try:
        _namedtuple(fields)  # names the judge would refuse: send a plain tuple instead
    except (ValueError, TypeError):
        return None
    return fields


_NAMEDTUPLES: dict[type, tuple[str, ...]] = {}  # the namedtuple classes `decode` made -> their fields


@functools.lru_cache(maxsize=256)
def _namedtuple(fields: tuple[str, ...]) -> type:
    """A namedtuple class of our own making (collections.namedtuple refuses keywords, _names and duplicates)."""
    if len(fields) > 256 or not all(f.isascii() and f.isidentifier() for f in fields):
        raise ValueError("bad namedtuple fields")
    cls = collections.namedtuple("namedtuple", fields)
    _NAMEDTUPLES[cls] = fields
    return cls


def encode(x: Any, ref: Callable[[Any], int], depth: int = 0, subclasses: bool = False) -> Any:
    """`x` as JSON-ready plain data, exact types only; other objects become {"ref": ref(obj)}.

    `subclasses` (the untrusted child only): an instance of a subclass of a plain type or a deque is sent as its
    plain copy (`_plain_copy`), which the program could have returned itself; the judge never converts.
    """
    if depth > MAX_DEPTH:
        raise ValueError("nesting too deep")
    t = type(x)
    if t is int and x.bit_length() > 52:
        return {"int": hex(x)}  # hex has no digit limit and keeps JSON numbers exact
    if t is float and x != x or t is float and x in (float("inf"), float("-inf")):
        return {"float": repr(x)}
    if t in _PLAIN_SCALARS:
        return x
    if t is list:
        return [encode(v, ref, depth + 1, subclasses) for v in x]
    if t in (tuple, set, frozenset):
        return {t.__name__: [encode(v, ref, depth + 1, subclasses) for v in x]}
    if t is dict:
        return {
            "dict": [
                [encode(k, ref, depth + 1, subclasses), encode(v, ref, depth + 1, subclasses)] for k, v in x.items()
            ]
        }
    if t is bytes:
        return {"bytes": x.hex()}
    if t is complex:
        return {"complex": [encode(x.real, ref), encode(x.imag, ref)]}
    if t in _NAMEDTUPLES or subclasses and issubclass(t, tuple) and _namedtuple_fields(t, x) is not None:
        fields = _NAMEDTUPLES.get(t) or _namedtuple_fields(t, x)
        return {"namedtuple": [list(fields), [encode(v, ref, depth + 1, subclasses) for v in tuple.__iter__(x)]]}
    if subclasses:
        plain = _plain_copy(x)
        if plain is not _NOT_PLAIN:
            return encode(plain, ref, depth, subclasses)
    return {"ref": ref(x)}


def decode(x: Any, resolve: Callable[[int], Any], depth: int = 0) -> Any:
    """Inverse of `encode`, strict: raises ValueError on anything `encode` cannot have produced."""
    if depth > MAX_DEPTH:
        raise ValueError("nesting too deep")
    t = type(x)
    if t in _PLAIN_SCALARS:
        return x
    if t is list:
        return [decode(v, resolve, depth + 1) for v in x]
    if t is not dict or len(x) != 1:
        raise ValueError(f"not an encoded value: {type(x).__name__}")
    ((tag, body),) = x.items()
    if tag == "ref" and type(body) is int:
        return resolve(body)
    if tag == "int" and type(body) is str:
        return int(body, 16)
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError(f"bad {tag!r} body")
    items = [decode(v, resolve, depth + 1) for v in body]
    if tag == "tuple":
        return tuple(items)
    if (
        tag == "namedtuple"
        and len(items) == 2
        and all(type(v) is list for v in items)
        and len(items[0]) == len(items[1])
        and all(type(f) is str for f in items[0])
    ):
        return _namedtuple(tuple(items[0]))._make(items[1])
    if tag == "set":
        return set(items)
    if tag == "frozenset":
        return frozenset(items)
    if tag == "dict" and all(type(kv) is list and len(kv) == 2 for kv in items):
        return {k: v for k, v in items}
    if tag == "complex" and len(items) == 2 and all(type(v) in (int, float) for v in items):
        return complex(*items)
    raise ValueError(f"unknown tag {tag!r}")


# ---- trusted side (the judge, forked by the launcher) ----


class Channel:
    """Newline-delimited JSON requests to one child, each answered before `deadline` (time.monotonic)."""

    def __init__(self, request_fd: int, reply_fd: int, deadline: float) -> None:
        self.request_fd, self.reply_fd, self.deadline = request_fd, reply_fd, deadline
        self.buffer = b""
        self.remotes: dict[int, Remote] = {}

    def receive(self) -> Any:
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.reply_fd], [], [], left)[0]:
                raise RemoteError("the program did not answer in time")
            chunk = os.read(self.reply_fd, 1 << 16)
            if not chunk or len(self.buffer) > MAX_MESSAGE_BYTES:
                raise RemoteError("the program closed its channel or sent too much")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise RemoteError("malformed reply") from e
        if type(message) is not dict:
            raise RemoteError("malformed reply")
        return message

    def request(self, op: str, ref: int, **fields: Any) -> Any:
        data = (json.dumps({"op": op, "ref": ref, **fields}) + "\n").encode()
        try:
            while data:  # the child reads requests one at a time; a full pipe means it is not listening
                if not select.select([], [self.request_fd], [], max(0.0, self.deadline - time.monotonic()))[1]:
                    raise RemoteError("the program stopped reading")
                data = data[os.write(self.request_fd, data[: 1 << 16]) :]
        except OSError as e:
            raise RemoteError("the program closed its channel") from e
        reply = self.receive()
        if "raised" in reply:
            name = reply["raised"]
            err = getattr(builtins, name, None) if type(name) is str else None
            if err in (StopIteration, StopAsyncIteration):
                # control flow, not an error: inside the test's map()/filter() it would end the iteration early,
                # and `all(map(f, xs))` would pass. As PEP 479 does for generators, it arrives as RuntimeError.
                raise RuntimeError(f"the program raised {name}")
            if isinstance(err, type) and issubclass(err, Exception) and err.__module__ == "builtins":
                raise err("raised by the program")
            raise RemoteError("the program raised")
        try:
            return self.decode(reply["value"]), reply.get("args")
        except (KeyError, ValueError, TypeError, RecursionError) as e:
            raise RemoteError("malformed value") from e

    def decode(self, x: Any) -> Any:
        return decode(x, self.remote)

    def remote(self, ref: int) -> Remote:
        if ref not in self.remotes:
            self.remotes[ref] = Remote(self, ref)
        return self.remotes[ref]


def _refuse(self: Remote, *args: Any) -> Any:
    raise TypeError("objects of the program's own types are not compared; return plain data")


class Remote:
    """A handle on one of the program's objects: calls and attribute reads go to the child; no comparisons."""

    __slots__ = ("_channel", "_ref")
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = _refuse
    __hash__ = object.__hash__

    def __init__(self, channel: Channel, ref: int) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_ref", ref)

    def _ask(self, op: str, **fields: Any) -> Any:
        return self._channel.request(op, self._ref, **fields)[0]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name=name, value=encode(value, _ref_of))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        enc = [encode(a, _ref_of) for a in args]
        value, new_args = self._channel.request(
            "call", self._ref, args=enc, kwargs={k: encode(v, _ref_of) for k, v in kwargs.items()}
        )
        _write_back(args, new_args, self._channel)
        return value

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key=encode(key, _ref_of))

    def __len__(self) -> int:
        n = self._ask("len")
        if type(n) is not int or n < 0:
            raise RemoteError("bad len")
        return n

    def __iter__(self) -> Any:
        items = self._ask("list")
        if type(items) is not list:
            raise RemoteError("bad iteration")
        return iter(items)

    def __bool__(self) -> bool:
        return self._ask("bool") is True

    def __str__(self) -> str:
        s = self._ask("str")
        if type(s) is not str:
            raise RemoteError("bad str")
        return s

    def __repr__(self) -> str:
        return f"<program object #{self._ref}>"


def _ref_of(obj: Any) -> int:
    if type(obj) is Remote:
        return object.__getattribute__(obj, "_ref")
    raise TypeError(f"cannot pass a {type(obj).__name__} to the program")


def _write_back(args: tuple, new_args: Any, channel: Channel) -> None:
    """Arguments the program mutated in place (a list it sorted) change in the test too, at the top level."""
    if type(new_args) is not list or len(new_args) != len(args):
        return
    for old, enc in zip(args, new_args):
        if type(old) in (list, dict, set):
            new = channel.decode(enc)
            if type(new) is type(old):
                old.clear()
                (old.extend if type(old) is list else old.update)(new)


def _trusted_module(name: str) -> types.ModuleType | None:
    if name.split(".")[0] in _UNTRUSTED_STDLIB:
        return None
    try:
        return __import__(name)
    except Exception:  # a module this interpreter lacks (or that fails to import here) stays unbound
        return None


class _TestNamespace(dict):
    """Globals of one test: program values are fetched on first use; names resolve as in plain Python, except
    that a builtin's name stands for the program's object only when the test is about it (`_builtin_names`)."""

    def __init__(self, channel: Channel, names: dict, module_like: set[str], free: set[str]) -> None:
        super().__init__(__builtins__=builtins, __name__="__main__")
        self.channel, self.lazy = channel, {}
        names = {k: v for k, v in names.items() if type(k) is str and not k.startswith("__") and type(v) is dict}
        trusted_modules = module_like & set(sys.stdlib_module_names)
        own_builtins = _builtin_names(set(names), free, trusted_modules)
        for name, desc in names.items():
            if hasattr(builtins, name) and name not in own_builtins:
                continue
            if name in trusted_modules:
                # `math` is the real math whatever the program bound to that name (a fake isclose passes nothing);
                # which module is decided by the name alone, never by what the child says
                trusted = _trusted_module(name)
                if trusted is not None:
                    self[name] = trusted
            elif desc.get("plain") is True and type(desc.get("ref")) is int:
                self.lazy[name] = desc["ref"]
            elif type(desc.get("ref")) is int:
                self[name] = channel.remote(desc["ref"])

    def __missing__(self, name: str) -> Any:
        if name not in self.lazy:
            raise KeyError(name)
        value = self.channel.request("value", self.lazy.pop(name))[0]
        self[name] = value
        return value


def _builtin_names(program: set[str], free: set[str], trusted_modules: set[str]) -> set[str]:
    """The builtin-named program names the test gets as the program's objects.

    A test refers to the function it checks, so when none of its free names that the program defines is
    anything but a builtin's name (`assert pow(2, 3) == 8` against a program `pow`), those names are the
    program's: the builtin would pass any program. When the test also uses another program name (`add`), the
    builtins it uses are helpers (`abs(add(a, b) - c) < 1e-9`) and stay the real ones, so a program `abs`
    that returns 0 cannot pass it.
    """
    used = free & program
    subjects = {n for n in used if not hasattr(builtins, n) and n not in trusted_modules}
    return set() if subjects else {n for n in used if hasattr(builtins, n)}


def _module_like(tree: ast.AST) -> set[str]:
    """Names the test uses as `name.attr` and never calls as `name(...)`: modules, when stdlib names."""
    bases = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return bases - called


def _free_names(tree: ast.AST) -> set[str]:
    """Names the test reads and never binds anywhere (assignment, def, class, argument, import, except, match)."""
    read, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (read if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, ast.alias):
            bound.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            bound.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            bound.add(n.rest)
    return read - bound


def run_assert_test(test: str, channel: Channel) -> bool:
    """True iff the program loaded and `test` ran to the end (trusted code; the caller bounds its time)."""
    try:
        hello = channel.receive()
        if type(hello.get("globals")) is not dict:
            return False
        code = compile(test, "test.py", "exec", ast.PyCF_ONLY_AST)
        namespace = _TestNamespace(channel, hello["globals"], _module_like(code), _free_names(code))
        exec(compile(code, "test.py", "exec"), namespace)
    except Exception:  # trust boundary: any failure of the test, the program or the channel is a failed test
        return False
    return True


# ---- untrusted side (run as a script in the sandboxed child) ----


def _child(argv: list[str]) -> None:
    mode, program_fd = argv[0], int(argv[1])
    with os.fdopen(program_fd, "rb") as f:
        source = f.read()
    module = types.ModuleType("__main__")
    module.__file__ = "solution.py"
    sys.modules["__main__"] = module
    code = compile(source, "solution.py", "exec")
    if mode == "stdio":
        exec(code, module.__dict__)
        return
    requests, replies = os.fdopen(int(argv[2]), "rb"), os.fdopen(int(argv[3]), "wb")
    objects: list[Any] = []
    refs: dict[int, int] = {}

    def ref(obj: Any) -> int:
        if id(obj) not in refs:
            refs[id(obj)] = len(objects)
            objects.append(obj)
        return refs[id(obj)]

    def send(message: dict) -> None:
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    try:
        exec(code, module.__dict__)
    except BaseException:
        send({"failed": "load"})
        return
    names = {}
    for name, value in list(module.__dict__.items()):
        names[name] = {"ref": ref(value), "plain": issubclass(type(value), (*_PLAIN_TYPES, collections.deque))}
    send({"globals": names})
    for line in requests:
        req = json.loads(line)
        try:
            obj = objects[req["ref"]]
            op, args = req["op"], None
            if op == "call":
                args = [decode(a, objects.__getitem__) for a in req["args"]]
                value = obj(*args, **{k: decode(v, objects.__getitem__) for k, v in req["kwargs"].items()})
            elif op == "getattr":
                value = getattr(obj, req["name"])
            elif op == "setattr":
                value = setattr(obj, req["name"], decode(req["value"], objects.__getitem__))
            elif op == "getitem":
                value = obj[decode(req["key"], objects.__getitem__)]
            else:
                value = {"value": lambda o: o, "len": len, "list": list, "bool": bool, "str": str}[op](obj)
            reply = {"value": encode(value, ref, subclasses=True)}
            if args is not None:
                reply["args"] = [encode(a, ref, subclasses=True) for a in args]
        except Exception as e:
            reply = {"raised": type(e).__name__}
        send(reply)


if __name__ == "__main__":
    _child(sys.argv[1:])
