#!/usr/bin/python3
"""PyTorch's own distributed test suite over gloo and over tandem.

Runs torch.testing._internal.distributed.distributed_test (Debian's
python3-torch 1.13, so /usr/bin/python3 only) the way torch's
test/distributed/test_distributed_spawn.py does: BACKEND, WORLD_SIZE,
TEMP_DIR and INIT_METHOD in the environment, and a
TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase)
class whose setUp spawns one process per rank.

    /usr/bin/python3 tests/python/torch_suite.py --backends gloo,tandem --world-sizes 2,3 \
        --output build/Testing/torch_suite [-k PATTERN ...] [--timeout 180] [--jobs 1]

Writes OUTPUT/summary.json and OUTPUT/summary.md: per backend and world
size the tests run, passed, skipped, failed and errors, and the tests that
pass for gloo but not for tandem with the first line of their error.
Exit status: 0; 1 when a test passes for gloo but not for tandem (or, for a
configuration run without gloo at its world size, when any test fails); 2
when the harness could not run a configuration; 77 without python3-torch.

How the suite sees tandem (in this process and in every rank it spawns):
  * `import tandem.c10d` registers the backend;
  * tandem is gloo for the suite's feature decisions: its module-level
    BACKEND is a str "tandem" that also equals "gloo" and hashes like it, so
    `BACKEND == "gloo"`, `BACKEND != "gloo"`, `BACKEND in {"gloo"}` and
    DistTestCases.backend_feature[...] treat tandem as gloo, while
    init_process_group(backend=BACKEND) and get_backend() say "tandem".
    Tests that need CUDA skip as they do for gloo.
  * the profiling allow-lists, checked against dist.get_backend(), get
    "tandem" next to "gloo" only with --profiling: the collective tests
    then expect profiler events named "tandem:<op>", and check them before
    the values, so by default the values are what is checked.
Ranks start from a forkserver that imported torch and the suite once
(--start forkserver, the default: about 0.5 s a test), each given the
environment its test set up; --start spawn imports torch in every rank of
every test as test_distributed_spawn.py does (6-15 s a test on 2 cores).
Python 3.11 and torch 1.13: torch.distributed._shard declares dataclass
fields whose default is an unhashable dataclass instance, which 3.11
refuses; such defaults become a default_factory returning that instance
(3.10's behaviour). python3-torch's common_utils imports expecttest, which
Debian does not package: a stand-in is used when it is missing.
"""
import argparse
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SUITE = "torch.testing._internal.distributed.distributed_test"
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
STATUSES = ("passed", "skipped", "failed", "errors")


# --------------------------------------------------------------------------
# The suite's side: runs in a runner process and in every rank it starts
# (each imports this file as the module torch_suite with TANDEM_SUITE_ROLE set).
# --------------------------------------------------------------------------

class _GlooLike(str):
    """The backend name "tandem", equal to "gloo" too and hashed like it."""

    def __eq__(self, other):
        return isinstance(other, str) and (str.__eq__(other, "gloo") or str.__eq__(other, str(self)))

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash("gloo")

    def __str__(self):
        return str.__str__(self)

    def __reduce__(self):  # pickled (to a spawned rank) as the plain name
        return (str, (str.__str__(self),))


def _fix_dataclasses_for_311():
    import dataclasses
    if getattr(dataclasses, "_tandem_suite_patched", False):
        return
    original = dataclasses._get_field

    def unhashable_instance(value):
        return dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value).__hash__ is None

    def get_field(cls, name, type_, *rest):
        default = cls.__dict__.get(name, dataclasses.MISSING)
        if isinstance(default, dataclasses.Field) and unhashable_instance(default.default):
            default.default_factory, default.default = (lambda d=default.default: d), dataclasses.MISSING
        elif unhashable_instance(default):
            setattr(cls, name, dataclasses.field(default_factory=lambda d=default: d))
        return original(cls, name, type_, *rest)

    dataclasses._get_field = get_field
    dataclasses._tandem_suite_patched = True


def _expecttest_stand_in():
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types
        import unittest
        module = types.ModuleType("expecttest")
        module.ACCEPT = False

        class TestCase(unittest.TestCase):
            def assertExpectedInline(self, actual, expect, skip=0):
                self.assertEqual(str(actual).strip(), str(expect).strip())

        module.TestCase = TestCase
        sys.modules["expecttest"] = module


def _import_suite(backend):
    """Imports the suite with its BACKEND; for tandem, the gloo-like name."""
    import importlib.util
    if backend != "tandem":
        return importlib.import_module(SUITE)
    path = os.environ.get("TANDEM_PYTHONPATH") or os.path.join(SOURCE_DIR, "build", "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    import tandem.c10d  # noqa: F401  registers "tandem"
    spec = importlib.util.find_spec(SUITE)
    source = spec.loader.get_source(SUITE)
    line = 'BACKEND = os.environ["BACKEND"]'
    if source.count(line) != 1:
        raise RuntimeError(f"{spec.origin}: expected one line `{line}`")
    module = importlib.util.module_from_spec(spec)
    module.__dict__["_tandem_suite_backend"] = _GlooLike("tandem")
    sys.modules[SUITE] = module
    exec(compile(source.replace(line, "BACKEND = _tandem_suite_backend"), spec.origin, "exec"), module.__dict__)
    if os.environ.get("TANDEM_SUITE_PROFILING") == "1":
        for name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                     "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
            allow = getattr(module, name)
            if "gloo" in allow and "tandem" not in allow:
                allow.append("tandem")
    return module


def _define_suite():
    """test_distributed_spawn.py's class, for the backend in BACKEND."""
    import torch
    _fix_dataclasses_for_311()
    import torch.distributed._shard  # noqa: F401  (what the fix is for: DDP imports it)
    _expecttest_stand_in()
    torch.backends.cuda.matmul.allow_tf32 = False
    suite = _import_suite(os.environ["BACKEND"])

    class TestDistBackendWithSpawn(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

        def _spawn_processes(self):
            if os.environ.get("TANDEM_SUITE_START", "spawn") == "spawn":
                return super()._spawn_processes()
            # forkserver: ranks forked from a server that imported torch and the suite once, each
            # handed the environment this test set up (TEMP_DIR, INIT_METHOD, ...) as spawn would see it.
            context = torch.multiprocessing.get_context("forkserver")
            env = dict(os.environ)

            def process(target, name, args):
                return context.Process(target=_forked_rank, name=name, args=(env, target) + tuple(args))
            self._start_processes(process)

    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    return TestDistBackendWithSpawn


def _forked_rank(env, target, *args):
    """A rank forked from the forkserver: this test's environment, then the suite's _run."""
    os.environ.clear()
    os.environ.update(env)
    suite = sys.modules[SUITE]
    suite.INIT_METHOD = os.getenv("INIT_METHOD", "env://")  # read at import by a spawned rank
    target(*args)


# TANDEM_SUITE_ROLE: "run" or "list" in a runner, inherited by the ranks it spawns.
ROLE = os.environ.get("TANDEM_SUITE_ROLE", "")
if ROLE:
    sys.argv[1:] = []  # common_utils parses sys.argv when imported
    TestDistBackendWithSpawn = _define_suite()


def _first_error_line(text):
    """The exception line of the (first failing rank's) innermost traceback; for an
    AssertionError, whose text is generic, with the suite's line that asserted."""
    blocks = re.split(r"Process \d+ exited with error code \d+ and exception:\n", text)
    lines = (blocks[1] if len(blocks) > 1 else text).splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last):")]
    first = starts[-1] + 1 if starts else 0
    for i in range(first, len(lines)):
        if lines[i].strip() and not lines[i].startswith((" ", "\t")):
            error = re.sub(r"after (\d+)\.\d+ seconds", r"after \1 seconds", lines[i].strip())
            if error.startswith("AssertionError"):
                frames = [(m.group(1), j) for j in range(first, i)
                          if (m := re.match(r'\s+File ".*/distributed_test\.py", line (\d+)', lines[j]))]
                if frames:
                    line, j = frames[-1]
                    error += f" (distributed_test.py:{line}: {lines[j + 1].strip()})"
            return error
    return next((ln.strip() for ln in lines if ln.strip()), "(no message)")


def _runner(spec_path):
    """Runs the spec's tests in this process, one JSON line per event."""
    import unittest
    from torch.testing._internal import common_distributed
    spec = json.load(open(spec_path))
    common_distributed.TIMEOUT_DEFAULT = spec["timeout"]
    for name, value in list(common_distributed.TIMEOUT_OVERRIDE.items()):
        common_distributed.TIMEOUT_OVERRIDE[name] = max(value, spec["timeout"])
    out = open(spec["results"], "a", buffering=1)

    def emit(**record):
        out.write(json.dumps(record) + "\n")

    class Result(unittest.TestResult):
        def startTest(self, test):
            super().startTest(test)
            self.started = time.time()
            emit(event="start", test=test._testMethodName)
            print(f"[torch_suite] {test._testMethodName} ...", flush=True)

        started = time.time()

        def record(self, test, status, text="", reason=""):
            name = getattr(test, "_testMethodName", str(test))  # or a class fixture's error holder
            emit(event="end", test=name, status=status, seconds=round(time.time() - self.started, 2),
                 error=_first_error_line(text) if text else "", reason=reason, detail=text[-20000:])
            print(f"[torch_suite] {name} {status}", flush=True)

        def addSuccess(self, test):
            self.record(test, "passed")

        def addSkip(self, test, reason):
            self.record(test, "skipped", reason=str(reason))

        def addFailure(self, test, err):
            self.record(test, "failed", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            text = self._exc_info_to_string(err, test)
            # A rank's assertion arrives as the parent's RuntimeError: still a failure, not an error.
            self.record(test, "failed" if _first_error_line(text).startswith("AssertionError") else "errors", text)

        def addExpectedFailure(self, test, err):
            self.record(test, "passed")

        def addUnexpectedSuccess(self, test):
            self.record(test, "failed", "unexpected success")

    if os.environ.get("TANDEM_SUITE_START") == "forkserver":
        import multiprocessing
        multiprocessing.set_forkserver_preload(["torch_suite"])
    tests = unittest.TestSuite(TestDistBackendWithSpawn(name) for name in spec["tests"])
    tests.run(Result())
    emit(event="done")


def _list_tests():
    import unittest
    print(json.dumps(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)))


# --------------------------------------------------------------------------
# The driver: no torch here; one runner process per shard of a configuration.
# --------------------------------------------------------------------------

# A runner imports this file as the module torch_suite from `-c`: its ranks (spawned, or forked from
# a forkserver that preloaded torch_suite) find the suite's class there, and no __main__ is re-run.
_RUNNER = [sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import torch_suite; sys.exit(torch_suite.main())"]


def _env(backend, world_size, temp_dir, init_method, timeout, tandem_path):
    env = dict(os.environ)
    env.update(BACKEND=backend, WORLD_SIZE=str(world_size), TEMP_DIR=temp_dir, TANDEM_SUITE_ROLE="run",
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout), PYTHONUNBUFFERED="1")
    env["INIT_METHOD"] = "env://" if init_method == "env" else "file://" + os.path.join(temp_dir, "init_file")
    if tandem_path:
        env["TANDEM_PYTHONPATH"] = tandem_path
    # The forkserver imports torch_suite by name, and Python 3.11's forkserver ignores the sys.path it is sent.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(temp_dir, sub), exist_ok=True)
    return env


def _snapshot(tandem_path, where):
    """Copies the tandem package and libtandem.so.0 (found beside it, as in a build tree), so a
    rebuild during the run cannot hand different ranks different builds."""
    import shutil
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(os.path.join(tandem_path, "tandem"), os.path.join(where, "tandem"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = os.path.join(os.path.dirname(os.path.abspath(tandem_path)), "lib", "libtandem.so.0")
    if os.path.exists(lib):  # the extension's RUNPATH names the build's lib/; LD_LIBRARY_PATH comes first
        os.makedirs(os.path.join(where, "lib"))
        shutil.copy(lib, os.path.join(where, "lib", "libtandem.so.0"))
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (os.path.join(where, "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    return where


def _select(names, patterns, exact):
    def wanted(name):
        if exact and name in exact:
            return True
        for p in patterns:  # unittest's -k: a pattern without wildcards matches as a substring
            if fnmatch.fnmatchcase(name, p if any(c in p for c in "*?[") else f"*{p}*"):
                return True
        return not patterns and not exact
    return [n for n in names if wanted(n)]


class Shard:
    """One runner process over a list of tests; restarted past a hung or crashed test."""

    def __init__(self, cfg, index, tests, args):
        self.cfg, self.index, self.todo, self.args = cfg, index, list(tests), args
        self.results, self.proc, self.done = {}, None, False
        self.base = os.path.join(args.output, f"{cfg['backend']}-ws{cfg['world_size']}-shard{index}")
        self.log = open(self.base + ".log", "w")
        self.results_path = self.base + ".jsonl"
        open(self.results_path, "w").close()
        self.offset, self.current, self.started = 0, None, None

    def launch(self):
        self.todo = [t for t in self.todo if t not in self.results]
        if not self.todo:
            self.done = True
            return
        temp_dir = tempfile.mkdtemp(prefix="tmp-", dir=self.args.output)  # the suite's own TEMP_DIRs are per test
        spec = self.base + ".spec.json"
        json.dump({"tests": self.todo, "results": self.results_path, "timeout": self.args.timeout}, open(spec, "w"))
        env = _env(self.cfg["backend"], self.cfg["world_size"], temp_dir, self.args.init_method,
                   self.args.timeout, self.args.tandem_path)
        env["TANDEM_SUITE_SPEC"] = spec
        env["TANDEM_SUITE_START"] = self.args.start
        env["TANDEM_SUITE_PROFILING"] = "1" if self.args.profiling else "0"
        self.proc = subprocess.Popen(_RUNNER, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.current, self.started = None, time.time()

    def poll(self):
        """Reads new events; kills a runner whose test outlived its limit; relaunches after a loss."""
        with open(self.results_path) as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in complete.splitlines():
            rec = json.loads(line)
            if rec["event"] == "start":
                self.current, self.started = rec["test"], time.time()
            elif rec["event"] == "end":
                rec.pop("event")
                self.results[rec["test"]] = rec
                self.current = None
        if self.done:
            return
        code = self.proc.poll()
        limit = self.args.timeout + 120  # the suite's own limit fires first; this catches a stuck parent
        if code is None and self.current and time.time() - self.started > limit:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self._lost(f"harness: no result after {limit} s; the runner and its ranks were killed")
            self.launch()
        elif code is not None:
            if self.current:
                self._lost(f"harness: the runner exited with status {code} during this test")
            elif set(self.todo) - set(self.results) and not self._progressed_since_launch():
                for t in self.todo:  # the runner died before any test: every test is an error
                    if t not in self.results:
                        self.results[t] = {"test": t, "status": "errors", "seconds": 0, "reason": "",
                                           "error": f"harness: the runner exited with status {code} before running tests "
                                                    f"(see {self.base}.log)", "detail": ""}
            self.launch()

    def _progressed_since_launch(self):
        return any(t in self.results for t in self.todo)

    def _lost(self, why):
        self.results[self.current] = {"test": self.current, "status": "errors", "reason": "",
                                      "seconds": round(time.time() - self.started, 2), "error": why, "detail": ""}
        self.current = None


def _run_all(args, configs):
    """Runs every configuration's shards, at most args.jobs runner processes at once."""
    pending = [Shard(cfg, i, cfg["tests"][i::args.jobs], args) for cfg in configs
               for i in range(min(args.jobs, max(1, len(cfg["tests"]))))]
    for shard in pending:
        shard.cfg.setdefault("shards", []).append(shard)
    running, finished = [], []
    while pending or running:
        while pending and len(running) < args.jobs:
            shard = pending.pop(0)
            shard.cfg.setdefault("start", time.time())
            shard.launch()
            running.append(shard)
        time.sleep(0.5)
        for shard in list(running):
            shard.poll()
            if shard.done:
                shard.poll()
                running.remove(shard)
                finished.append(shard)
                cfg = shard.cfg
                if all(s.done for s in cfg["shards"]):
                    cfg["seconds"] = round(time.time() - cfg["start"], 1)
                    _print_config(cfg)
    for cfg in configs:
        cfg["results"] = {}
        for shard in cfg.pop("shards"):
            cfg["results"].update(shard.results)
        cfg.pop("start", None)


def _counts(results):
    counts = {s: 0 for s in STATUSES}
    for r in results.values():
        counts[r["status"]] += 1
    counts["run"] = len(results)
    return counts


def _print_config(cfg):
    results = {}
    for shard in cfg["shards"]:
        results.update(shard.results)
    c = _counts(results)
    print(f"{cfg['backend']} ws={cfg['world_size']}: run {c['run']}, passed {c['passed']}, skipped {c['skipped']}, "
          f"failed {c['failed']}, errors {c['errors']} in {cfg['seconds']} s", flush=True)


def _gaps(configs):
    """Per world size: tests that pass for gloo but not for tandem."""
    by = {(c["backend"], c["world_size"]): c for c in configs}
    gaps = {}
    for (backend, ws), cfg in sorted(by.items()):
        gloo = by.get(("gloo", ws))
        if backend != "tandem" or not gloo:
            continue
        gaps[str(ws)] = [{"test": t, "status": r["status"], "error": r["error"] or r.get("reason", "")}
                         for t, r in sorted(cfg["results"].items())
                         if r["status"] != "passed" and gloo["results"].get(t, {}).get("status") == "passed"]
    return gaps


def _markdown(summary):
    out = [f"# PyTorch distributed_test: {summary['date']}", "",
           f"`{summary['command']}` (torch {summary['torch']}, Python {summary['python']}, "
           f"ranks started by {summary['start']}, per-test limit {summary['timeout']} s, "
           f"{summary['jobs']} runner(s) at once)", "",
           "| backend | world size | run | passed | skipped | failed | errors | wall time |",
           "|---|---|---|---|---|---|---|---|"]
    for c in summary["configs"]:
        k = c["counts"]
        out.append(f"| {c['backend']} | {c['world_size']} | {k['run']} | {k['passed']} | {k['skipped']} | "
                   f"{k['failed']} | {k['errors']} | {c['seconds']} s" + (" (baseline)" if "from_baseline" in c else "") + " |")
    for ws, gaps in summary["gaps"].items():
        out += ["", f"## Pass for gloo, not for tandem, at world size {ws}: {len(gaps)}", ""]
        groups = {}
        for g in gaps:
            groups.setdefault(g["error"], []).append(g)
        for error, tests in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            names = ", ".join(f"`{g['test']}`" + ("" if g["status"] == "errors" else f" ({g['status']})") for g in tests)
            out.append(f"- {len(tests)} × `{error.replace('`', chr(39))}`: {names}")
    return "\n".join(out) + "\n"


def main():
    if ROLE == "run":
        return _runner(os.environ["TANDEM_SUITE_SPEC"])
    if ROLE == "list":
        return _list_tests()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="gloo,tandem", help="comma-separated: gloo, tandem")
    parser.add_argument("--world-sizes", default="2,3", help="comma-separated world sizes")
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="run the tests matching this pattern (unittest's -k; repeatable)")
    parser.add_argument("--tests", default="", help="comma-separated exact test names (with -k: either)")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test (torch's longer limits kept)")
    parser.add_argument("--jobs", type=int, default=1, help="runner processes at once (each spawns its ranks)")
    parser.add_argument("--init-method", choices=("file", "env"), default="file",
                        help="INIT_METHOD the suite is told (each test still rendezvouses through its own file)")
    parser.add_argument("--start", choices=("forkserver", "spawn"), default="forkserver",
                        help="how ranks start: forked from a server that imported torch and the suite once "
                             "(about 0.5 s a test), or spawned as test_distributed_spawn.py does (torch imported "
                             "per rank per test: 6-15 s a test on 2 cores)")
    parser.add_argument("--profiling", action="store_true",
                        help="put tandem on the suite's profiling allow-lists next to gloo: the collective tests "
                             "then also expect profiler events named tandem:<op> (checked before the values)")
    parser.add_argument("--output", default="torch_suite_results", help="directory for summary.json, summary.md, logs")
    parser.add_argument("--baseline", help="an earlier summary.json whose gloo results are used where gloo is not run")
    parser.add_argument("--no-snapshot", dest="snapshot", action="store_false",
                        help="use the tandem build in place (by default it is copied to OUTPUT/tandem-snapshot first)")
    parser.add_argument("--tandem-path", default=os.environ.get("TANDEM_PYTHONPATH")
                        or os.path.join(SOURCE_DIR, "build", "python"), help="directory holding the tandem package")
    args = parser.parse_args()
    os.makedirs(args.output, exist_ok=True)
    args.output = os.path.abspath(args.output)
    backends = [b for b in args.backends.split(",") if b]
    sizes = [int(w) for w in args.world_sizes.split(",") if w]
    if "tandem" in backends:
        if not os.path.isdir(os.path.join(args.tandem_path, "tandem")):
            sys.exit(f"torch_suite: no tandem package in {args.tandem_path} (build the tandem_c10d target)")
        if args.snapshot:
            args.tandem_path = _snapshot(args.tandem_path, os.path.join(args.output, "tandem-snapshot"))

    env = _env("gloo", 2, tempfile.mkdtemp(prefix="tmp-", dir=args.output), "file", 60, None)
    env["TANDEM_SUITE_ROLE"] = "list"
    listing = subprocess.run(_RUNNER, capture_output=True, text=True, env=env)
    if listing.returncode != 0:
        if subprocess.run([sys.executable, "-c", "import torch.distributed"], capture_output=True).returncode:
            print(f"torch_suite: skipped: {sys.executable} has no torch.distributed (python3-torch)")
            return 77
        sys.exit(f"torch_suite: cannot import {SUITE}:\n{listing.stderr[-3000:]}")
    every = json.loads(listing.stdout.strip().splitlines()[-1])
    exact = {t for t in args.tests.split(",") if t}
    if exact - set(every):
        sys.exit(f"torch_suite: no such test in {SUITE}: {', '.join(sorted(exact - set(every)))}")
    names = _select(every, args.patterns, exact)
    if not names:
        sys.exit("torch_suite: no test matches")
    print(f"torch_suite: {len(names)} tests × backends {backends} × world sizes {sizes}, "
          f"{args.jobs} runner(s) at once; output in {args.output}", flush=True)

    configs = [{"backend": b, "world_size": w, "tests": names} for b in backends for w in sizes]
    _run_all(args, configs)
    if args.baseline:
        old = json.load(open(args.baseline))
        for c in old["configs"]:
            if c["backend"] == "gloo" and c["world_size"] in sizes and "gloo" not in backends:
                c["results"] = {t: r for t, r in c["results"].items() if t in names}
                c["counts"] = _counts(c["results"])
                c["from_baseline"] = args.baseline
                configs.append(c)
    import glob
    import shutil
    for temp_dir in glob.glob(os.path.join(args.output, "tmp-*")):
        shutil.rmtree(temp_dir, ignore_errors=True)
    torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    for c in configs:
        c.pop("tests", None)
        c["counts"] = _counts(c["results"])
    configs.sort(key=lambda c: (c["backend"] != "gloo", c["backend"], c["world_size"]))
    summary = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "command": " ".join([sys.executable] + sys.argv),
               "torch": torch_version, "python": sys.version.split()[0], "timeout": args.timeout, "jobs": args.jobs,
               "start": args.start, "profiling": args.profiling,
               "configs": configs, "gaps": _gaps(configs)}
    json.dump(summary, open(os.path.join(args.output, "summary.json"), "w"), indent=1)
    markdown = _markdown(summary)
    open(os.path.join(args.output, "summary.md"), "w").write(markdown)
    print(markdown)
    broken = [c for c in configs if c["counts"]["run"] == 0 or any(
        r["error"].startswith("harness: the runner exited with status") and "before running" in r["error"]
        for r in c["results"].values())]
    if broken:
        return 2
    # tandem is held to gloo where gloo ran at its world size; otherwise every test must pass or skip.
    compared = {int(ws) for ws in summary["gaps"]}
    alone = [c for c in configs if c["world_size"] not in compared and c["counts"]["failed"] + c["counts"]["errors"]]
    return 1 if any(summary["gaps"].values()) or alone else 0


if __name__ == "__main__":
    sys.exit(main())
