"""Code verifiers and the local sandbox: scoring tables and escape attempts (each contained and scored 0)."""

import os
import socket
import threading
import time

import pytest

from rlvr.rewards.code_verifiers import last_code_block, parse_tests
from rlvr.rewards.registry import get_reward
from rlvr.rewards.sandbox import LocalSandboxExecutor, RemoteExecutor, SandboxLimits, isolation_level

needs_isolation = pytest.mark.skipif(
    isolation_level() != "namespaces", reason="needs root and unshare (namespace isolation)"
)
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
STDIO = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4", "output": "6"}]


def fenced(code: str, lang: str = "python") -> str:
    return f"Here you go:\n```{lang}\n{code}\n```\n"


CASES = [
    # (completion, tests, code, code_binary)
    (fenced("def add(a, b):\n    return a + b"), ASSERTS, 2 / 3, 0.0),
    (fenced("def add(a, b):\n    return a - b"), ASSERTS, 0.0, 0.0),
    (fenced("a, b = map(int, input().split())\nprint(a + b)"), STDIO, 1.0, 1.0),
    (fenced("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a * b)"), STDIO, 0.0, 0.0),
    (
        fenced("def add(a, b): return 0") + fenced("def add(a, b):\n    return a + b", ""),
        ASSERTS,
        2 / 3,
        0.0,
    ),  # last block
    ("def add(a, b):\n    return a + b", ASSERTS, 0.0, 0.0),  # no fence
    ("", ASSERTS, 0.0, 0.0),
    ("<think>" + fenced("def add(a, b):\n    return a + b") + "</think>no code", ASSERTS, 0.0, 0.0),
    (fenced("def add(a, b):\n    return a + b  # ünïcödé ✓ {{}}"), ASSERTS, 2 / 3, 0.0),
    ("x" * 100_000 + fenced("def add(a, b):\n    return a + b"), ASSERTS, 2 / 3, 0.0),
    (fenced("raise SystemExit(0)\ndef add(a, b):\n    return a + b"), ASSERTS, 0.0, 0.0),
    (fenced("import os\nos._exit(0)"), ASSERTS, 0.0, 0.0),  # exiting early passes nothing
    (fenced("def add(a, b):\n    return a + b\nimport builtins\nbuiltins.AssertionError = None"), ASSERTS, 2 / 3, 0.0),
]


@needs_isolation
@pytest.mark.parametrize("completion,tests,frac,binary", CASES, ids=[str(i) for i in range(len(CASES))])
def test_code_table(completion, tests, frac, binary):
    assert get_reward("code").fn(completion, {"tests": tests}) == pytest.approx(frac)
    assert get_reward("code_binary").fn(completion, {"ground_truth": tests}) == binary


def test_parse_tests_and_blocks():
    assert parse_tests({"ground_truth": '["assert 1"]'}) == ["assert 1"]
    assert parse_tests({"tests": {"inputs": ["1"], "outputs": ["2"]}}) == [{"input": "1", "output": "2"}]
    assert parse_tests({}) is None
    assert get_reward("code").fn(fenced("x"), {}) is None
    assert last_code_block("```py\na\n```\n```\nb\n```") == "b\n"
    with pytest.raises(ValueError):
        parse_tests({"tests": [1, 2]})


# ---- escapes: each must score 0 and leave nothing behind ----
FAST = SandboxLimits(test_timeout_s=2.0)


def run_one(program: str, tests=("assert True",), limits=FAST) -> tuple[list[bool], float]:
    start = time.perf_counter()
    passed = LocalSandboxExecutor(limits).run(program, list(tests))
    return passed, time.perf_counter() - start


@needs_isolation
def test_infinite_loop_is_killed():
    passed, elapsed = run_one("while True:\n    pass")
    assert passed == [False] and elapsed < 10


@needs_isolation
def test_fork_bomb_is_contained():
    passed, elapsed = run_one("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert passed == [False] and elapsed < 15
    assert run_one("x = 1", ["assert x == 1"])[0] == [True]  # the next sample is unaffected


@needs_isolation
def test_one_gigabyte_allocation_fails():
    passed, _ = run_one("x = bytearray(1024 ** 3)\nx[-1] = 1")
    assert passed == [False]


@needs_isolation
def test_cannot_write_outside_scratch(tmp_path):
    target = tmp_path / "escape.txt"
    os.chmod(tmp_path, 0o777)
    program = (
        f"for p in [{str(target)!r}, '/work/escape.txt', '/root/escape.txt', '/etc/escape.txt']:\n"
        "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
        "assert False"
    )
    passed, _ = run_one(program)
    assert passed == [False]
    assert not target.exists() and not os.path.exists("/work/escape.txt") and not os.path.exists("/etc/escape.txt")


@needs_isolation
def test_cannot_read_other_sample_files():
    writer = "import os, time\nopen('secret.txt', 'w').write('s3cret')\nopen('/tmp/secret2.txt', 'w').write('x')\ntime.sleep(3)"
    reader = (
        "import glob, os\n"
        "found = glob.glob('/tmp/**/secret*', recursive=True) + glob.glob('/tmp/rlvr-sandbox-*/**', recursive=True)\n"
        "assert found, 'nothing to read'"
    )
    results = {}
    t = threading.Thread(
        target=lambda: results.setdefault("w", run_one(writer, limits=SandboxLimits(test_timeout_s=5)))
    )
    t.start()
    time.sleep(1.0)
    results["r"] = run_one(reader)
    t.join()
    assert results["r"][0] == [False]


@needs_isolation
def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'hi')\n"
        passed, _ = run_one(program)
        assert passed == [False]
        server.settimeout(0.2)
        with pytest.raises(OSError):
            server.accept()
    finally:
        server.close()


@needs_isolation
def test_cannot_kill_parent():
    program = (
        "import os, signal\n"
        "for pid in [os.getppid(), 1, -1]:\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "assert os.getuid() == 0"
    )
    passed, _ = run_one(program)
    assert passed == [False]  # and we (the test process, the worker's parent chain) are alive to assert it


@needs_isolation
def test_huge_stdout_is_cut():
    completion = fenced("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    start = time.perf_counter()
    assert get_reward("code").fn(completion, {"tests": [{"input": "", "output": "x"}]}) == 0.0
    assert time.perf_counter() - start < 15


@needs_isolation
def test_runs_unprivileged_in_namespaces():
    # the test code runs in the judge: what the program sees comes back through its own functions
    program = (
        "import os\nSTATUS = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
        "def ids():\n    return os.getuid(), os.getgid(), os.getgroups(), os.getpid(), os.getcwd()\n"
        "def tmp():\n    return os.listdir('/tmp')"
    )
    tests = [
        "uid, gid, groups, pid, cwd = ids()\nassert uid not in (0, 65534) and gid == uid and groups == []",
        "assert ids()[3] < 10 and ids()[4] == '/tmp/work'",
        "assert tmp() == ['work']",
        "assert all(int(STATUS[k].strip(), 16) == 0 for k in ('CapEff', 'CapPrm', 'CapInh', 'CapBnd', 'CapAmb'))",
        "assert STATUS['NoNewPrivs'].strip() == '1'",
    ]
    assert run_one(program, tests)[0] == [True] * len(tests)


@needs_isolation
def test_judge_runs_unprivileged_and_apart():
    """While the judge runs the test code, the program sees it: no capabilities, another uid, no_new_privs."""
    program = (
        "import os\ndef others():\n    out = []\n    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit() and int(pid) not in (1, os.getpid()):\n"
        "            st = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status') if ':' in l)\n"
        "            out.append({k: st[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Uid')})\n"
        "    return out\ndef my_uid():\n    return os.getuid()"
    )
    test = (
        "import os\njudges = others()\nassert len(judges) == 1\nj = judges[0]\n"
        "assert int(j['CapEff'], 16) == int(j['CapPrm'], 16) == int(j['CapBnd'], 16) == 0\n"
        "assert j['NoNewPrivs'] == '1' and int(j['Uid'].split()[0]) == os.getuid() not in (0, my_uid())"
    )
    assert run_one(program, [test])[0] == [True]


def test_rlimits_mode_drops_capabilities_too():
    status = LocalSandboxExecutor(FAST, level="rlimits").run_capture("print(open('/proc/self/status').read())")
    caps = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert all(int(caps[k].strip(), 16) == 0 for k in ("CapEff", "CapPrm", "CapInh", "CapAmb"))
    assert caps["NoNewPrivs"].strip() == "1"
    if os.geteuid() == 0:
        assert int(caps["CapBnd"].strip(), 16) == 0 and int(caps["Uid"].split()[0]) != 0


# ---- honest programs of many shapes still pass: assert tests see the program's objects through handles ----
SHAPES = [
    (
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n            seen[x] = i",
        "assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]",
    ),
    ("def sort_in_place(xs):\n    xs.sort()", "a = [3, 1, 2]\nsort_in_place(a)\nassert a == [1, 2, 3]"),
    (
        "def check(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x",
        "try:\n    check(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError",
    ),
    ("LIMIT = 10 ** 30\nPRIMES = [2, 3, 5]", "assert LIMIT == 10 ** 30 and PRIMES[-1] == 5"),
    (
        "class Node:\n    def __init__(self, val, next=None):\n        self.val, self.next = val, next\n"
        "def build(xs):\n    head = None\n    for x in reversed(xs):\n        head = Node(x, head)\n    return head",
        "def to_list(n):\n    out = []\n    while n is not None:\n        out.append(n.val)\n        n = n.next\n"
        "    return out\nassert to_list(build([1, 2, 3])) == [1, 2, 3]",
    ),
    ("def gen(n):\n    yield from range(n)", "assert list(gen(3)) == [0, 1, 2] and sum(gen(4)) == 6"),
    ("import math\ndef area(r):\n    return math.pi * r * r", "assert math.isclose(area(1.0), 3.141592653589793)"),
    (
        "def f():\n    return (1, 'a'), {'k': {1, 2}}, b'x', None, float('inf')",
        "assert f() == ((1, 'a'), {'k': {1, 2}}, b'x', None, float('inf'))",
    ),
    ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)", "assert fib(20) == 6765\nassert fib(1) == 1"),
    (
        "def copy(xs):\n    return list(xs) + [0]\nimport heapq\ndef smallest(xs):\n    return heapq.nsmallest(1, xs)",
        "assert copy([1]) == [1, 0] and smallest([3, 1]) == [1] and heapq.nlargest(1, [3, 1]) == [3]",
    ),
    (
        "def candidate_sum(xs):\n    return sum(xs)",
        "def check(candidate):\n    assert candidate([1, 2]) == 3\ncheck(candidate_sum)",
    ),
    (
        "class Counter:\n    def __init__(self):\n        self.n = 0\n    def inc(self):\n        self.n += 1\n"
        "        return self",
        "c = Counter()\nc.inc().inc()\nassert c.n == 2 and len([c]) == 1 and c is not None",
    ),
    # subclasses of plain types come back as their plain copies
    (
        "from collections import Counter\ndef count(s):\n    return Counter(s)",
        "assert count('aab') == {'a': 2, 'b': 1}",
    ),
    (
        "from collections import defaultdict\ndef group(xs):\n    d = defaultdict(list)\n    for x in xs:\n"
        "        d[x % 2].append(x)\n    return d",
        "assert group([1, 2, 3]) == {1: [1, 3], 0: [2]}",
    ),
    (
        "from collections import OrderedDict\ndef ordered(xs):\n    return OrderedDict((x, i) for i, x in enumerate(xs))",
        "assert ordered('ba') == {'b': 0, 'a': 1} and list(ordered('ba')) == ['b', 'a']",
    ),
    (
        "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\ndef mid(a, b):\n"
        "    return Point((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)",
        "assert mid((0, 0), (2, 4)) == (1.0, 2.0) and mid((0, 0), (2, 4)).y == 2.0",
    ),
]


@needs_isolation
@pytest.mark.parametrize("program,test", SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_honest_shapes_pass(program, test):
    assert get_reward("code_binary").fn(fenced(program), {"tests": [test]}) == 1.0


BUILTIN_NAMED = [
    # (program, tests, code): the task's function has a builtin's name; the test must check the program's
    ("def pow(a, b):\n    return 0", ["assert pow(2, 3) == 8", "assert pow(3, 2) == 9"], 0.0),
    ("def pow(a, b):\n    return a * b", ["assert pow(2, 3) == 8", "assert pow(2, 2) == 4"], 0.5),
    (
        "def pow(a, b):\n    r = 1\n    for _ in range(b):\n        r *= a\n    return r",
        ["assert pow(2, 3) == 8", "assert pow(3, 2) == 9"],
        1.0,
    ),
    ("def max(xs):\n    return xs[0]", ["assert max([1, 3, 2]) == 3"], 0.0),
    (
        "def sorted(xs):\n    return list(xs)",
        ["def check(candidate):\n    assert candidate([2, 1]) == [1, 2]\ncheck(sorted)"],
        0.0,
    ),
    # a program `abs` beside the tested `add` does not reach the test's `abs`
    ("def add(a, b):\n    return 0\ndef abs(x):\n    return 0", ["assert abs(add(1, 2) - 3) < 1e-9"], 0.0),
]


@needs_isolation
@pytest.mark.parametrize("program,tests,frac", BUILTIN_NAMED, ids=[str(i) for i in range(len(BUILTIN_NAMED))])
def test_builtin_named_task_function_is_tested(program, tests, frac):
    assert get_reward("code").fn(fenced(program), {"tests": tests}) == pytest.approx(frac)


def test_remote_executor_failure_scores_zero():
    executor = RemoteExecutor("http://127.0.0.1:9/none", timeout_s=1)  # discard port: nothing listens
    assert executor.run("x", ["assert True", "assert True"]) == [False, False]


def test_remote_executor_protocol():
    import json
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.update(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"results": [1, 0]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/test_program"
    score = get_reward("code").fn(fenced("pass"), {"tests": ["assert 1", "assert 0"]}, executor_url=url)
    thread.join()
    server.server_close()
    assert score == 0.5 and seen["program"] == "pass\n" and seen["tests"] == ["assert 1", "assert 0"]
