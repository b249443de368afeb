"""Check exports against the runtimes: every command's flags, every manifest's schema.

For each plan file and each target (and each of its flag-table releases) whose check accepts the
plan, the export is built in memory and
* offline (always; the test suite runs this part): every command's flags against the flag table
  of the release it was written for (`export/flag_tables.json`, generated from the wheels by
  `gen_flag_tables.py`), every Dynamo manifest against the vendored CRD made strict and every
  llm-d values file against the chart's values schema;
* with a runtime's own parser (`--vllm-python` / `--sglang-python`: an interpreter of a scratch
  venv with that runtime installed): every `vllm serve` / `vllm bench serve` / `sglang` / router
  command parsed by the runtime's argument parser, in a child process.

    python benchmarks/check_exports.py plan1.json plan2.json ... [--vllm-python /tmp/venv/bin/python]
        [--release-python vllm==0.10.2=/tmp/py-0.10.2]   # that release's parser for its table's commands

Prints one row per export and the count of rejections; exit 1 if any.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
VENDOR = ROOT / "src" / "opweave_planner" / "export" / "vendor"
TABLES = ROOT / "src" / "opweave_planner" / "export" / "flag_tables.json"
ROUTER_VERSIONS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
VLLM_OF = {"dynamo": "0.10.2", "llm-d": "0.33.0"}  # the vLLM a Kubernetes target's worker runs


def commands(files: dict[str, bytes]) -> list[list[str]]:
    """Every runtime command line of the export's scripts and manifests, as argv (a script's
    `${VAR}` expansions read as one stand-in word)."""
    import yaml

    out = []
    for name, data in sorted(files.items()):
        if name.endswith(".sh"):
            text = data.decode().replace("\\\n", " ")
            # a variable reads as the default the script gives it, else a stand-in of its kind
            values = {k: v for k, v in re.findall(r'^(\w+)="\$\{\w+:-([^}]*)\}"', text, re.M) if "$" not in v}
            text = re.sub(r"\$\{(\w+)[^}]*\}", lambda m, v=values: v.get(m.group(1)) or _stand_in(m.group(1)), text)
            for line in text.splitlines():
                line = line.removeprefix("exec ").strip()
                if line.startswith(("vllm ", "python3 -m sglang", "vllm-router ")):
                    out.append(shlex.split(line))
        elif name.endswith(".yaml"):
            for c in _containers(yaml.safe_load(data)):
                out.append(["vllm", "serve", *c["args"]] if "command" in c else ["vllm", "serve", "MODEL", *c["args"]])
    return out


def _stand_in(var: str) -> str:
    return "10.0.0.1" if var.endswith(("HOST", "ADDRESS")) else "/tmp/sample.jsonl" if var == "SAMPLE" else "1"


def _containers(doc) -> list[dict]:
    if isinstance(doc, dict):
        found = [doc] if isinstance(doc.get("args"), list) else []
        return found + [c for v in doc.values() for c in _containers(v)]
    if isinstance(doc, list):
        return [c for v in doc for c in _containers(v)]
    return []


def table_of(target: str, version: str, argv: list[str]) -> tuple[str, str, str]:
    """(runtime, release, command) of the flag table `argv` keeps to."""
    if argv[0] == "vllm-router":
        return "vllm-router", ROUTER_VERSIONS["vllm-router"], "router"
    if argv[:3] == ["python3", "-m", "sglang_router.launch_router"]:
        return "sglang-router", ROUTER_VERSIONS["sglang-router"], "router"
    if argv[:2] == ["python3", "-m"]:
        return "sglang", version, "server" if argv[2] == "sglang.launch_server" else "bench"
    vllm = VLLM_OF.get(target, version)
    if argv[1] == "bench":  # a timed_trace sample needs the newest client, a fixed one the release's own
        return "vllm", "0.33.0" if "timed_trace" in argv else vllm, "bench"
    return "vllm", vllm, "serve"




def dynamo_own(tables: dict, version: str) -> set[str]:
    """Dynamo's worker flags that vLLM's parser does not know (`--is-prefill-worker`): they are
    checked against Dynamo's table offline and left out of what vLLM's own parser reads (the
    exporter writes only value-less ones)."""
    vllm = set(tables["vllm"][VLLM_OF["dynamo"]]["serve"])
    return set(tables["dynamo"][version]["worker"]) - vllm


def validators():
    import jsonschema

    from opweave_planner.export.documents import strict_schema

    crd = json.loads((VENDOR / "dynamo-0.6.0" / "dynamographdeployments.v1alpha1.json").read_text())
    chart = json.loads((VENDOR / "llm-d-modelservice-v0.4.12" / "values.schema.json").read_text())
    return {"dynamographdeployment.yaml": jsonschema.Draft7Validator(strict_schema(crd["openAPIV3Schema"])),
            "values.yaml": jsonschema.Draft7Validator(chart)}


def offline(files: dict[str, bytes], target: str, version: str, tables: dict, schemas) -> tuple[int, list[str]]:
    """(flag uses checked, rejections) of one export, without any runtime installed."""
    import yaml

    uses, bad = 0, []
    for argv in commands(files):
        runtime, release, command = table_of(target, version, argv)
        known = set(tables[runtime][release][command])
        if target == "dynamo" and command == "serve":  # the worker's own flags beside vLLM's
            known |= set(tables["dynamo"][version]["worker"])
        used = [a for a in argv if a.startswith("--")]
        uses += len(used)
        bad += [f"{runtime} {release} {command}: {flag}" for flag in used if flag not in known]
    for name, validator in schemas.items():
        if name in files:
            bad += [f"{name}: {'/'.join(map(str, e.path))}: {e.message}"
                    for e in validator.iter_errors(yaml.safe_load(files[name]))]
    return uses, bad


# the child program: parse each argv with the runtime's own parser, print the rejections as JSON
_PARSE = r'''
import argparse, json, sys
jobs, bad = json.load(sys.stdin), []
def vllm_parsers():
    import vllm.platforms as platforms  # no GPU here: the parser's DeviceConfig default infers one
    if not platforms.current_platform.device_type:
        platforms.current_platform.device_type = "cuda"
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.benchmarks.serve import add_cli_args
    serve = make_arg_parser(FlexibleArgumentParser())
    bench = FlexibleArgumentParser(); add_cli_args(bench)
    return serve, bench
parsers = {}
for kind, argv in jobs:
    try:
        if kind in ("vllm serve", "vllm bench"):
            if "vllm" not in parsers:
                parsers["vllm"] = vllm_parsers()
            p = parsers["vllm"][0 if kind == "vllm serve" else 1]
            p.parse_args(argv)
        elif kind == "vllm-router":
            from vllm_router.router_args import RouterArgs
            p = argparse.ArgumentParser(); RouterArgs.add_cli_args(p, use_router_prefix=False); p.parse_args(argv)
        elif kind == "sglang-router":
            from sglang_router.router_args import RouterArgs
            p = argparse.ArgumentParser(); RouterArgs.add_cli_args(p, use_router_prefix=False); p.parse_args(argv)
        elif kind == "sglang server":
            from sglang.srt.server_args import ServerArgs
            p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p); p.parse_args(argv)
    except SystemExit:
        bad.append(f"{kind}: {' '.join(argv)[:200]}")
print(json.dumps(bad))
'''


def parse_jobs(argvs: list[list[str]]) -> dict[str, list]:
    """Each argv as (parser kind, arguments after the program) by the interpreter it needs."""
    jobs: dict[str, list] = {"vllm": [], "sglang": []}
    for argv in argvs:
        if argv[0] == "vllm":
            jobs["vllm"].append((f"vllm {argv[1]}", argv[3:] if argv[1] == "bench" else argv[2:]))
        elif argv[0] == "vllm-router":
            jobs["vllm"].append(("vllm-router", argv[1:]))
        elif argv[2] == "sglang_router.launch_router":
            jobs["sglang"].append(("sglang-router", argv[3:]))
        elif argv[2] == "sglang.launch_server":
            jobs["sglang"].append(("sglang server", argv[3:]))
    return jobs


def online(python: str, jobs: list) -> list[str]:
    ran = subprocess.run([python, "-c", _PARSE], input=json.dumps(jobs), capture_output=True, text=True,
                         timeout=900)
    if ran.returncode != 0:
        raise RuntimeError(f"{python}: the parser check failed: {ran.stderr[-2000:]}")
    return json.loads(ran.stdout.strip().splitlines()[-1])


def main() -> int:
    from opweave_planner.errors import InfeasibleError
    from opweave_planner.export import TARGETS, build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--vllm-python", help="interpreter with vllm (and vllm-router) installed")
    ap.add_argument("--sglang-python", help="interpreter with sglang (and sglang-router) installed")
    ap.add_argument("--release-python", action="append", default=[], metavar="RUNTIME==VERSION=PYTHON",
                    help="interpreter whose runtime is that release: the commands written for its flag table "
                         "are parsed there instead (e.g. vllm==0.10.2=/tmp/py-vllm-0.10.2); repeatable")
    args = ap.parse_args()
    tables, schemas = json.loads(TABLES.read_text()), validators()
    by_release = {}
    for spec in args.release_python:
        m = re.fullmatch(r"([a-z-]+)==([0-9.]+)=(.+)", spec)
        if m is None:
            ap.error(f"--release-python: '{spec}' is not RUNTIME==VERSION=PYTHON")
        by_release[(m.group(1), m.group(2))] = m.group(3)
    rows, total_bad, every = [], 0, {"vllm": [], "sglang": [], **{f"{r}=={v}": [] for r, v in by_release}}
    for plan in args.plans:
        for name, target in TARGETS.items():
            for version in target.versions:
                try:
                    _ctx, files = build(plan, name, runtime_version=version)
                except InfeasibleError as exc:
                    if version == target.versions[-1]:
                        rows.append((Path(plan).name, name, "-", "refused", 0, 0, str(exc)[:90]))
                    continue
                uses, bad = offline(files, name, version, tables, schemas)
                argvs = commands(files)
                own = dynamo_own(tables, version) if name == "dynamo" else set()
                for argv in argvs:
                    runtime, release, _command = table_of(name, version, argv)
                    for key, jobs in parse_jobs([[a for a in argv if a not in own]]).items():
                        every[f"{runtime}=={release}" if (runtime, release) in by_release else key] += jobs
                man = json.loads(files["export.json"])
                d = man["deployment"]
                shape = (f"aggregated: {d['aggregated']['replicas']} replicas" if d.get("aggregated") else
                         f"{d['copies']} copies" + (" + prefill pool" if d.get("prefill") else ""))
                rows.append((Path(plan).name, name, version, f"{shape}, {d['gpus_total']} GPUs", len(argvs), uses,
                             "; ".join(bad) or "0"))
                total_bad += len(bad)
    parsed = {}
    pythons = [("vllm", args.vllm_python), ("sglang", args.sglang_python),
               *((f"{r}=={v}", py) for (r, v), py in by_release.items())]
    for key, python in pythons:
        if python:
            rejected = online(python, every[key])
            parsed[key] = (len(every[key]), rejected)
            total_bad += len(rejected)
    print("| plan | target | release | deployment | commands | flag uses | offline rejections |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    exports = sum(1 for r in rows if r[3] != "refused")
    print(f"\n{exports} exports, {sum(r[5] for r in rows)} flag uses checked against the flag tables")
    for key, (n, rejected) in parsed.items():
        print(f"{key}'s own parsers{' (the rest of its releases)' if '==' not in key else ''}: {n} commands "
              f"parsed, {len(rejected)} rejected"
              + "".join(f"\n  {r}" for r in rejected))
    for key in every:
        if key not in parsed:
            print(f"{key}'s own parsers: not run (no --{key}-python)")
    print(f"rejections: {total_bad}")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
