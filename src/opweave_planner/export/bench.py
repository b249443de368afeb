"""What every `benchmark.sh` shares: the plan's workload as variables and the TPOT comparison.

The comparison is a fixed Python program fed as a quoted here-doc (`<<'EOF'`: nothing in it
expands); the figures it compares reach it as quoted arguments, never as program text.
"""

from __future__ import annotations

import re

from opweave_planner.errors import InternalError
from opweave_planner.export.common import BASE_PORT
from opweave_planner.export.shell import ShellWord, Var, assign, integer, number, quote

BENCH_OUTPUT_TOKENS = 256  # decode tokens per benchmark request (the rest of the context is prompt)
# the variables a benchmark command reads (bench_env sets them, each overridable from the caller)
BENCH_VARS = {name: Var(name) for name in ("HOST", "PORT", "INPUT_LEN", "OUTPUT_LEN", "NUM_PROMPTS",
                                            "CONCURRENCY", "RESULT_DIR")}
_HEREDOC_END = "EOF"
_COMPARE = (
    "import json, sys",
    "path, predicted, slo = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])",
    "with open(path) as fh:",
    "    lines = [ln for ln in fh.read().splitlines() if ln.strip()]",
    "r = json.loads(lines[-1])  # a JSON file, or the last record of a JSONL file",
    "p50, p95 = float(r[{p50!r}]), float(r[{p95!r}])",
    'print(f"TPOT p50 {{p50:.2f}} ms, p95 {{p95:.2f}} ms; plan predicts {{predicted:.2f}} ms "',
    '      f"(p50 {{100 * (p50 / predicted - 1):+.1f}} %), SLO {{slo:g}} ms: "',
    '      f"{{\'met\' if p95 <= slo else \'MISSED\'}} at p95")',
)
_RESULT_KEY = re.compile(r"[a-z0-9_]+")


def compare_tpot_snippet(plan, p50_key: str, p95_key: str, result: ShellWord) -> list[str]:
    """Bash lines that read the benchmark's JSON result and print measured vs predicted TPOT."""
    if not (_RESULT_KEY.fullmatch(p50_key) and _RESULT_KEY.fullmatch(p95_key)):
        raise InternalError(f"benchmark result keys {p50_key!r}, {p95_key!r} are not plain names")
    body = [line.format(p50=p50_key, p95=p95_key) for line in _COMPARE]
    if _HEREDOC_END in body:
        raise InternalError("the benchmark's here-doc holds its own terminator")
    argv = ["python3", "-", result, number(plan.tpot_ms), number(plan.workload.tpot_slo_ms)]
    return [" ".join(quote(w) for w in argv) + f" <<'{_HEREDOC_END}'", *body, _HEREDOC_END]


def bench_env(plan) -> list[str]:
    """The benchmark's workload: `global_batch` concurrent requests filling the plan's context."""
    ctx_tokens = plan.workload.context_tokens
    out = min(BENCH_OUTPUT_TOKENS, max(2, ctx_tokens // 2))
    return [
        assign("HOST", Var("HOST", default="127.0.0.1")),
        assign("PORT", Var("PORT", default=integer(BASE_PORT))),
        assign("OUTPUT_LEN", Var("OUTPUT_LEN", default=integer(out))),
        f'INPUT_LEN="${{INPUT_LEN:-$(( {integer(ctx_tokens)} - OUTPUT_LEN ))}}"',
        assign("CONCURRENCY", Var("CONCURRENCY", default=integer(plan.global_batch)), "the plan\'s global batch"),
        'NUM_PROMPTS="${NUM_PROMPTS:-$CONCURRENCY}"  # one wave: every request decodes alongside the others',
        assign("RESULT_DIR", Var("RESULT_DIR", default="bench-results")),
        'mkdir -p "$RESULT_DIR"',
    ]
