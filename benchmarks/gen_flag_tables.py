"""Generate src/opweave_planner/export/flag_tables.json from the runtimes' own parser sources.

Reads each release's PyPI wheel (`pip download --no-deps`, nothing installed, no GPU) and takes
the flags its argument parser defines: every `--flag` string given to `add_argument` (f-strings
with a prefix placeholder, as the routers write them, keep their constant text) and, for the
dataclass-derived parsers (vLLM's EngineArgs / FrontendArgs, SGLang's ServerArgs and arg-group
fields, the routers' RouterArgs), `--` + each field name with `-` for `_`, as their
`add_cli_args` build them. The exporter's test checks that every generated command uses only
flags of the table of the release it was written for.

    python benchmarks/gen_flag_tables.py --wheels /tmp/wheels   # downloads what is missing there
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src" / "opweave_planner" / "export" / "flag_tables.json"

# runtime -> release -> command -> (files in the wheel, dataclasses whose fields are flags)
_VLLM_SERVE_CLASSES = ("EngineArgs", "AsyncEngineArgs", "FrontendArgs", "BaseFrontendArgs")
SOURCES = {
    "vllm": {v: {
        "serve": (("vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py",
                   "vllm/entrypoints/common/cli_args.py", "vllm/entrypoints/cli/serve.py",
                   "vllm/config/*.py", "vllm/entrypoints/openai/server_utils.py"), _VLLM_SERVE_CLASSES),
        "bench": (("vllm/benchmarks/serve.py", "vllm/benchmarks/datasets.py", "vllm/benchmarks/datasets/*.py"), ()),
    } for v in ("0.10.2", "0.26.0", "0.33.0")},
    "sglang": {
        "0.5.4": {"server": (("sglang/srt/server_args.py",), ("ServerArgs",)),
                  "bench": (("sglang/bench_serving.py",), ())},
        "0.5.23": {"server": (("sglang/srt/server_args.py", "sglang/srt/arg_groups/*.py",
                               "sglang/srt/arg_groups/fields/*.py"), ("*",)),
                   "bench": (("sglang/benchmark/serving.py", "sglang/benchmark/datasets/*.py"), ())},
    },
    "vllm-router": {"0.1.17": {"router": (("vllm_router/router_args.py",), ("RouterArgs",))}},
    "sglang-router": {"0.3.2": {"router": (("sglang_router/router_args.py",), ("RouterArgs",))}},
    # Dynamo's own worker flags (`--is-prefill-worker`, `--connector`, ...); its worker adds vLLM's
    # engine flags of the release it pins (the vllm table of that release)
    "dynamo": {"0.6.0": {"worker": (("dynamo/vllm/args.py",), ())}},
}
PACKAGE = {"vllm": "vllm", "sglang": "sglang", "vllm-router": "vllm-router", "sglang-router": "sglang-router",
           "dynamo": "ai-dynamo"}


def _flag_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # f"--{prefix}worker-urls": the constant text
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def flags_of(source: str, classes: tuple[str, ...]) -> set[str]:
    tree = ast.parse(source)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                text = _flag_text(arg)
                if text and text.startswith("--"):
                    out.add(text)
                    action = next((k.value for k in node.keywords if k.arg == "action"), None)
                    if getattr(action, "attr", "") == "BooleanOptionalAction":
                        out.add("--no-" + text[2:])
        if isinstance(node, ast.ClassDef) and ("*" in classes or node.name in classes):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id
                    if not name.startswith("_") and name.upper() != name:
                        out.add("--" + name.replace("_", "-"))
    return out


def wheel_for(wheels: Path, runtime: str, version: str) -> Path:
    stem = PACKAGE[runtime].replace("-", "_")
    found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                        f"{PACKAGE[runtime]}=={version}"], check=True)
        found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def table(wheels: Path) -> dict:
    import fnmatch

    out: dict = {}
    for runtime, releases in SOURCES.items():
        for version, commands in releases.items():
            with zipfile.ZipFile(wheel_for(wheels, runtime, version)) as whl:
                names = whl.namelist()
                for command, (patterns, classes) in commands.items():
                    flags: set[str] = set()
                    for name in names:
                        if any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
                            flags |= flags_of(whl.read(name).decode(), classes)
                    out.setdefault(runtime, {}).setdefault(version, {})[command] = sorted(flags)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default="/tmp/opweave-wheels", help="folder of (or for) the wheels")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    wheels = Path(args.wheels)
    wheels.mkdir(parents=True, exist_ok=True)
    doc = table(wheels)
    Path(args.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for runtime, releases in doc.items():
        for version, commands in releases.items():
            print(runtime, version, {c: len(f) for c, f in commands.items()})


if __name__ == "__main__":
    main()
