"""Generate tests for every path of the v1model program with p4testgen and run them on BMv2.

    python ptf/testgen.py [--max-tests N] [--seed S] [--out DIR] [--keep-logs DIR]      (as root; `make testgen`)

1. ``make p4`` (build/v1model/{bmv2.json,p4info.txtpb});
2. p4testgen (p4c's p4tools: ``p4testgen --target bmv2 --arch v1model``) explores the program's paths
   symbolically and writes one test case per path (``--test-backend protobuf``: table entries, input packet,
   expected output packets with don't-care masks), tracking which statements its tests cover;
3. the cases run on simple_switch_grpc in a namespace (ptf/run_ptf.py's harness, ptf/testgen/generated.py);
4. prints one JSON line: cases generated, passed, failed (with the first errors), and p4testgen's statement
   coverage. The exit status is 0 only if every case passed.

Paths p4testgen cannot turn into a runnable test are left out by options below, each with its reason
(docs/dataplane.md, Generated path coverage).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_ptf  # noqa: E402  (ptf/run_ptf.py)

REPO = run_ptf.REPO
PROGRAM = REPO / "p4src" / "v1model" / "netapprox.p4"
TESTGEN_TESTS = REPO / "ptf" / "testgen"
DEFAULT_MAX_TESTS = 0
"""0: one test for every path p4testgen finds (depth-first, until none is left)."""


def missing_tools() -> list[str]:
    return [t for t in ("p4testgen", "p4c-bm2-ss", "simple_switch_grpc", "ip") if shutil.which(t) is None]


PORT_RANGES = f"{run_ptf.PORTS[0]}:{run_ptf.PORTS[-1]},{run_ptf.CPU_PORT}:{run_ptf.CPU_PORT}"
"""Input and output ports p4testgen may choose: the namespace's veth ports and the CPU port (P4Runtime
packet-out/packet-in). Other ports have no interface to send on or listen to."""
PACKET_BITS = "128:32768"
"""Input packets of 16 to 4096 bytes. Below: a frame entering on the CPU port loses its 2-byte packet_out header
and leaves as is, and Linux does not send a frame shorter than an Ethernet header (14 bytes) on an Ethernet
device (p4testgen's protobuf back end would go down to 3 bytes). Above: ptf 0.12 reads at most 4096 bytes of a
received frame (dataplane.py, RCV_SIZE_DEFAULT), so a longer expected packet never matches."""
_NODES_COVERED = re.compile(r"Nodes covered: [0-9.eE+-]+ \((\d+)/(\d+)\)")


def generate(out: pathlib.Path, *, max_tests: int = DEFAULT_MAX_TESTS, seed: int = 1, timeout: float = 600) -> dict:
    """Run p4testgen into ``out``; returns {"cases": n, "coverage": covered/coverable statements or None,
    "covered": (covered, coverable), "log": its output, "command": the command line}."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = ["p4testgen", "--target", "bmv2", "--arch", "v1model", "--std", "p4-16", "-I", str(REPO / "p4src"),
           "--test-backend", "protobuf", "--out-dir", str(out), "--seed", str(seed),
           "--max-tests", str(max_tests), "--track-coverage", "STATEMENTS",
           "--port-ranges", PORT_RANGES, "--packet-size-range", PACKET_BITS, str(PROGRAM)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out)
    except subprocess.TimeoutExpired:
        raise run_ptf.HarnessError(f"p4testgen did not finish within {timeout:.0f}s (try --max-tests)") from None
    log = res.stdout + res.stderr
    if res.returncode != 0:
        raise run_ptf.HarnessError(f"p4testgen failed ({res.returncode}):\n{log[-4000:]}")
    cases = sorted(out.glob("*.txtpb"))
    # p4testgen prints "============ Test <n>: Nodes covered: <fraction> (<covered>/<coverable>) ====" per test.
    found = _NODES_COVERED.findall(log)
    covered = (int(found[-1][0]), int(found[-1][1])) if found else None
    coverage = covered[0] / covered[1] if covered and covered[1] else None
    return {"cases": len(cases), "coverage": coverage, "covered": covered, "log": log, "command": cmd}


def run_cases(out: pathlib.Path, workdir: pathlib.Path, timeout: float = 600) -> dict:
    """Run the cases in ``out`` on BMv2 in a namespace; returns the per-case results and the ptf output."""
    with run_ptf.Bmv2Namespace(workdir) as ns:
        res = run_ptf.run_ptf(ns, [], timeout=timeout, test_dir=TESTGEN_TESTS, params={"testgen_dir": str(out)})
        log_tail = ns.log_tail(40)
    results_file = out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    return {"returncode": res.returncode, "ptf": res.stdout, "switch_log": log_tail, "results": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tests", type=int, default=DEFAULT_MAX_TESTS, help="0: until p4testgen runs out of paths")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", metavar="DIR", help="keep the generated cases and results here (default: a temp dir)")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy the BMv2 and PTF logs here")
    args = ap.parse_args(argv)
    why = run_ptf.cannot_run("testgen", missing_tools())
    if why:
        print(why, file=sys.stderr)
        return 2
    if args.out and pathlib.Path(args.out).exists() and any(pathlib.Path(args.out).iterdir()):
        print(f"testgen: --out {args.out} is not empty (old cases would run with the new ones)", file=sys.stderr)
        return 2
    try:
        run_ptf.build()
    except run_ptf.HarnessError as e:
        print(f"testgen: {e}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="netapprox-testgen-") as tmp:
        out = pathlib.Path(args.out) if args.out else pathlib.Path(tmp) / "cases"
        workdir = pathlib.Path(tmp) / "run"
        workdir.mkdir()
        try:
            gen = generate(out, max_tests=args.max_tests, seed=args.seed)
            ran = run_cases(out, workdir)
        except run_ptf.HarnessError as e:
            print(f"testgen: {e}", file=sys.stderr)
            return 1
        if args.keep_logs:
            run_ptf.keep_logs(workdir, pathlib.Path(args.keep_logs))
            (pathlib.Path(args.keep_logs) / "p4testgen.log").write_text(gen["log"])
    failed = [r for r in ran["results"] if not r["passed"]]
    summary = {"cases": gen["cases"], "ran": len(ran["results"]), "passed": len(ran["results"]) - len(failed),
               "failed": [{"case": r["case"], "error": r["error"][:500]} for r in failed[:10]],
               "statement_coverage": gen["coverage"], "statements_covered": gen["covered"]}
    print(json.dumps(summary))
    if ran["returncode"] != 0 and not failed:
        print(ran["ptf"][-3000:], file=sys.stderr)
    return 0 if ran["returncode"] == 0 and not failed and ran["results"] else 1


if __name__ == "__main__":
    sys.exit(main())
