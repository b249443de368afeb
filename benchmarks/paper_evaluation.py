"""Reproduce the paper's evaluation grid with our shipped profiles.

Grid (Section 7): gemma-3-27b at TPOT SLOs 25/60 ms and qwen3-next-80b-a3b at
40/80 ms; contexts 8k/32k/128k; GPU pools h100, h100+l40s, h100+a100. Every
policy (opweave, colocated, afd, cad) is searched per cell with the default
(paper) search limits; with two GPU types, homogeneous opweave per type is
also run (Section 7.4). Writes the JSON named by --out, a markdown summary next
to it (same name, .md) and, with matplotlib (the [plot] extra), one
cost-versus-TPOT frontier per (model, pool) beside them (<stem>_<model>_<pool>.svg);
prints the markdown.

    python benchmarks/paper_evaluation.py --out eval/paper.json                 # full grid (long on 2 cores)
    python benchmarks/paper_evaluation.py --out eval/paper.json --pools h100    # the homogeneous part only
    python benchmarks/paper_evaluation.py --out eval/quick.json --quick  # 8k+32k, h100, smaller batch grid
    python benchmarks/paper_evaluation.py --out benchmarks/results/paper_evaluation.json --force  # the shipped one
    python benchmarks/paper_evaluation.py --out eval/paper.json --markdown-only  # .md and figures from the .json

--out is required, and a file under benchmarks/results/ (the shipped results) is
written only with --force. Results are merged into an existing output file by
(model, pool), so the grid can be filled in over several runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

from opweave_planner.compare import compare, iter_violations
from opweave_planner.plan import dumps

SHIPPED = (Path(__file__).resolve().parent / "results").resolve()

GRID = {
    "gemma-3-27b": ["25ms", "60ms"],
    "qwen3-next-80b-a3b": ["40ms", "80ms"],
}
CONTEXTS = ["8k", "32k", "128k"]
POOLS = ["h100", "h100,l40s", "h100,a100"]
QUICK_SPACE = dict(batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), max_owners=3)

PAPER = {
    "max_ratio_homogeneous": 1.78,
    "max_ratio_heterogeneous": 1.89,
    "stages": {"gemma-3-27b": {"opweave_mean": 20.7, "afd_cad": 124},
               "qwen3-next-80b-a3b": {"opweave_mean": 24, "afd_cad": 96}},
    "occupancy": {"opweave": ">80%", "baselines": "~50%"},
}


def _fmt(x, spec=".3f", none="✗"):
    return none if x is None else format(x, spec)


def _fmt_stages(x) -> str:
    """Baseline stage counts: a number, or a list of distinct counts ("124", "96/124")."""
    if x is None:
        return "n/a"
    if isinstance(x, (list, tuple, set)):
        return "/".join(str(v) for v in sorted(x)) if x else "n/a"
    return str(x)


def markdown(doc: dict) -> str:
    lines = ["# Paper evaluation grid (our profiles)", ""]
    for _key, run in sorted(doc["runs"].items()):
        r = run["result"]
        pols = r["policies"]
        lines += [f"## {r['model']} on {'+'.join(r['gpus'])}", "",
                  f"search space: {run['space_label']}; wall time {run['seconds']:.0f} s", "",
                  "| ctx | SLO | " + " | ".join(f"{p} $/Mtok" for p in pols) + " | ratio | "
                  + " | ".join(f"{p} stages" for p in pols) + " | "
                  + " | ".join(f"{p} occ." for p in pols) + " | opweave MiB/tok | opweave per-GPU batch |"
                  + (" hetero vs best homo |" if any("homogeneous" in c for c in r["cells"]) else ""),
                  "|" + "---|" * (5 + 3 * len(pols) + (1 if any("homogeneous" in c for c in r["cells"]) else 0))]
        for c in r["cells"]:
            P = c["policies"]
            ow = P.get("opweave", {})
            row = [c["context"], f"{c['slo_ms']:g} ms"]
            row += [_fmt(P[p]["usd_per_million_tokens"]) for p in pols]
            row += [_fmt(c["ratio"], ".2f", "–") + ("×" if c["ratio"] else "")]
            row += [str(P[p]["num_stages"]) if P[p]["feasible"] else "✗" for p in pols]
            row += [f"{100 * P[p]['price_weighted_occupancy']:.0f}%" if P[p]["feasible"] else "✗" for p in pols]
            row += [_fmt(ow.get("inter_node_mib_per_token"), ".3g"), _fmt(ow.get("per_gpu_batch"), ".3g")]
            if "homogeneous" in c:
                row += [_fmt(c["hetero_ratio"], ".2f", "–") + (f"× (vs {c['best_homogeneous']})"
                                                             if c["hetero_ratio"] else "")]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    s = doc.get("summary", {})
    lines += ["## Summary against the paper", "",
              "| figure | paper | ours |", "|---|---|---|",
              f"| max opweave ratio, homogeneous H100 | up to 1.78× | {_fmt(s.get('max_ratio_homogeneous'), '.2f', 'n/a')} |",
              f"| max opweave ratio, heterogeneous pools | up to 1.89× | {_fmt(s.get('max_ratio_heterogeneous'), '.2f', 'n/a')} |",
              f"| max hetero vs best homogeneous opweave | (Section 7.4) | {_fmt(s.get('max_hetero_vs_homogeneous'), '.2f', 'n/a')} |"]
    for m, st in s.get("stages", {}).items():
        p = PAPER["stages"].get(m, {})
        lines.append(f"| {m}: mean opweave stages vs AFD/CAD | {p.get('opweave_mean')} vs {p.get('afd_cad')} | "
                     f"{_fmt(st.get('opweave_mean'), '.1f', 'n/a')} vs {_fmt_stages(st.get('afd_cad'))} |")
    lines.append(f"| mean price-weighted occupancy opweave vs baselines (feasible cells) | >80% vs ~50% | "
                 f"{_fmt(s.get('occupancy_opweave'), '.0%', 'n/a')} vs {_fmt(s.get('occupancy_baselines'), '.0%', 'n/a')} |")
    lines.append(f"| dominance violations (opweave dearer than a feasible baseline) | 0 | {s.get('violations', 'n/a')} |")
    return "\n".join(lines) + "\n"


def summarize(doc: dict) -> dict:
    homo, het, hv, occ_o, occ_b, viol = [], [], [], [], [], 0
    stages: dict[str, dict] = {}
    for run in doc["runs"].values():
        r = run["result"]
        viol += len(iter_violations(r))
        target = homo if len(r["gpus"]) == 1 else het
        target += [c["ratio"] for c in r["cells"] if c["ratio"] is not None]
        hv += [c["hetero_ratio"] for c in r["cells"] if c.get("hetero_ratio") is not None]
        st = stages.setdefault(r["model"], {"opweave": [], "afd_cad": set()})
        for c in r["cells"]:
            for p, e in c["policies"].items():
                if not e["feasible"]:
                    continue
                if p == "opweave":
                    st["opweave"].append(e["num_stages"])
                    occ_o.append(e["price_weighted_occupancy"])
                else:
                    occ_b.append(e["price_weighted_occupancy"])
                    if p in ("afd", "cad"):
                        st["afd_cad"].add(e["num_stages"])
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    return {
        "max_ratio_homogeneous": max(homo) if homo else None,
        "max_ratio_heterogeneous": max(het) if het else None,
        "max_hetero_vs_homogeneous": max(hv) if hv else None,
        "stages": {m: {"opweave_mean": mean(v["opweave"]), "opweave_all": v["opweave"],
                       "afd_cad": sorted(v["afd_cad"])} for m, v in stages.items()},
        "occupancy_opweave": mean(occ_o),
        "occupancy_baselines": mean(occ_b),
        "violations": viol,
        "paper": PAPER,
    }


def shipped(out: Path) -> bool:
    """Whether `out` lies in the shipped results folder (written only with --force)."""
    return out.resolve().parent == SHIPPED or SHIPPED in out.resolve().parents


def figures(doc: dict, out: Path) -> list[Path]:
    """One frontier per run beside the tables; none (and a note) without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib not installed (pip install '.[plot]'): tables only, no figures", file=sys.stderr)
        return []
    from opweave_planner.cli.compare import plot_compare

    paths = []
    for key, run in sorted(doc["runs"].items()):
        model, pool = key.split("@", 1)
        path = out.with_name(f"{out.stem}_{model}_{pool.replace(',', '+')}.svg")
        plot_compare(run["result"], str(path))
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(GRID), help="comma-separated subset of " + ", ".join(GRID))
    ap.add_argument("--pools", default=";".join(POOLS), help="';'-separated GPU pools, e.g. 'h100;h100,a100'")
    ap.add_argument("--ctx", default=",".join(CONTEXTS))
    ap.add_argument("--quick", action="store_true", help="8k,32k on h100 with a smaller batch grid")
    ap.add_argument("--jobs", "-j", type=int, default=1)
    ap.add_argument("--out", required=True, help="the JSON to write (the .md and figures go beside it)")
    ap.add_argument("--force", action="store_true", help="allow writing into the shipped benchmarks/results/")
    ap.add_argument("--markdown-only", action="store_true",
                    help="rewrite the markdown and figures next to --out from the existing JSON; search nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if shipped(out) and not args.force:
        ap.error(f"--out {out}: that is the shipped results folder; pass --force to overwrite it, "
                 f"or name another file")
    if args.markdown_only:
        doc = orjson.loads(out.read_bytes())
        text = markdown(doc)
        out.with_suffix(".md").write_text(text)
        figures(doc, out)
        print(text)
        return 0
    space_kw = {}
    space_label = "paper defaults (TP 1/2/4/8, 20 batch sizes to 1024, <=3 owners, <=4 microbatches, <=4 replicas, <=32 GPUs)"
    pools = [p for p in args.pools.split(";") if p]
    ctx = args.ctx
    if args.quick:
        space_kw, pools, ctx = dict(QUICK_SPACE), ["h100"], "8k,32k"
        space_label = f"quick: batches {QUICK_SPACE['batches']}, <=3 owners"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = orjson.loads(out.read_bytes()) if out.exists() else {"runs": {}}
    cache: dict = {}
    for model in [m for m in args.models.split(",") if m]:
        for pool in pools:
            t0 = time.perf_counter()
            print(f"{model} on {pool} ...", file=sys.stderr, flush=True)
            r = compare(model, ctx, GRID[model], gpus=pool, jobs=args.jobs, cache=cache,
                        progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True), **space_kw)
            dt = time.perf_counter() - t0
            doc["runs"][f"{model}@{pool}"] = {"result": r, "seconds": dt, "space_label": space_label,
                                             "quick": args.quick}
            doc["summary"] = summarize(doc)
            out.write_bytes(dumps(doc))
            out.with_suffix(".md").write_text(markdown(doc))
            print(f"  done in {dt:.0f} s", file=sys.stderr, flush=True)
    figures(doc, out)
    text = markdown(doc)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
