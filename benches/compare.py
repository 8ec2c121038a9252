#!/usr/bin/env python3
"""kiln against NumPy, side by side in one run.

    python3 benches/compare.py [--runs N] [--no-docs] [--kiln-json FILE]

1. Makes (once) a virtual environment with NumPy and matplotlib under
   target/bench-venv (BENCH_VENV overrides the place) and re-runs itself in it.
2. Runs `cargo run --release --example bench -- --json`: kiln's workloads, fused and
   unfused, and the machine's copy/triad/read limits measured in the same process.
3. Runs NumPy's version of every workload (same shapes, same dtypes; bf16 has no NumPy
   dtype, and NumPy's f16 matmul has no BLAS path, so neither is timed), best of the same
   number of runs after warm-up.
4. Prints the ratio table and, unless --no-docs, writes docs/benchmarks.png and the
   section of docs/benchmarks.md between the bench-suite markers.

NumPy runs its elementwise ops and reductions on one thread (each op a full pass over
memory) and its matmuls through its BLAS with every core; kiln uses every core for both.
"""

import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("BENCH_VENV", os.path.join(ROOT, "target", "bench-venv"))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
PNG = os.path.join(ROOT, "docs", "benchmarks.png")
BEGIN = "<!-- bench-suite:begin (written by benches/compare.py) -->"
END = "<!-- bench-suite:end -->"


def ensure_venv():
    """Re-executes this script inside the benchmark virtual environment."""
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        print(f"creating {VENV} (numpy, matplotlib)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "numpy", "matplotlib"], check=True)
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def lscpu():
    """Model name, family, model and core count as lscpu reports them."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    f = {}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        f[k.strip()] = v.strip()
    name = f.get("Model name", "unknown CPU")
    return "{} (family {}, model {}; {} CPUs; L3 {})".format(
        name, f.get("CPU family", "?"), f.get("Model", "?"), f.get("CPU(s)", "?"), f.get("L3 cache", "?")
    )


def run_kiln(runs, extra):
    cmd = ["cargo", "run", "--release", "--quiet", "--example", "bench", "--", "--json", "--runs", str(runs)]
    print("running:", " ".join(cmd + extra), file=sys.stderr)
    out = subprocess.run(cmd + extra, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"kiln bench failed ({out.returncode})")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


# ------------------------------------------------------------------------------ NumPy


def numpy_workloads(np):
    """(name, dtype) -> (function to time, ops per call or None)."""
    n, s = 1 << 24, 4096
    rng = np.random.default_rng(0)

    def normal(shape, dt):
        return rng.standard_normal(shape, dtype=np.float32).astype(dt)

    a, b, c = (normal((n,), np.float32) for _ in range(3))
    x = normal((s, s), np.float32)
    w = {}
    w[("a*b+c", "f32")] = (lambda: a * b + c, None)

    def chain(a, b):
        return np.tanh(np.exp(-(a * b + 1)) * a.dtype.type(0.5) + a) * b - a.dtype.type(0.25)

    a16, b16 = normal((n,), np.float16), normal((n,), np.float16)
    w[("chain", "f32")] = (lambda: chain(a, b), None)
    w[("chain", "f16")] = (lambda: chain(a16, b16), None)
    w[("row sum", "f32")] = (lambda: x.sum(1), None)
    w[("row max", "f32")] = (lambda: x.max(1), None)
    w[("col sum", "f32")] = (lambda: x.sum(0), None)
    x16 = normal((s, s), np.float16)
    w[("row sum", "f16")] = (lambda: x16.sum(1), None)
    w[("transpose", "f32")] = (lambda: np.ascontiguousarray(x.T), None)
    cp, cq, cr = normal((s, s // 4), np.float32), normal((s, s // 4), np.float32), normal((s, s // 2), np.float32)
    w[("cat", "f32")] = (lambda: np.concatenate([cp, cq, cr], axis=1), None)

    def softmax(x):
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def layer_norm(x, eps=np.float32(1e-5)):
        m = x.mean(1, keepdims=True)
        d = x - m
        v = (d * d).mean(1, keepdims=True)
        return d / np.sqrt(v + eps)

    w[("softmax", "f32")] = (lambda: softmax(x), None)
    w[("layer_norm", "f32")] = (lambda: layer_norm(x), None)
    for k in (1024, 2048):
        l, r, bias = normal((k, k), np.float32), normal((k, k), np.float32), normal((k,), np.float32)
        w[("matmul", "f32", k)] = (lambda l=l, r=r: l @ r, None)
        w[("matmul a@b.t()", "f32", k)] = (lambda l=l, r=r: l @ r.T, None)
        w[("matmul a.t()@b", "f32", k)] = (lambda l=l, r=r: l.T @ r, None)
        w[("matmul+bias+relu", "f32", k)] = (lambda l=l, r=r, bias=bias: np.maximum(l @ r + bias, 0), None)
    lx, lw, lb = normal((2048, 128), np.float32), normal((512, 128), np.float32), normal((512,), np.float32)
    w[("linear x@w.t()", "f32")] = (lambda: lx @ lw.T, None)
    w[("linear+bias+relu", "f32")] = (lambda: np.maximum(lx @ lw.T + lb, 0), None)
    sa, sb = normal((16,), np.float32), normal((16,), np.float32)

    def small_graph():
        y = sa
        for i in range(100):
            y = y + sb if i % 2 == 0 else y * sa
        return y

    w[("replay 100 ops", "f32")] = (small_graph, 100)
    return w


def time_numpy(fn, runs, reps=1):
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t) / reps * 1e3)
    return min(times)


def numpy_blas(np):
    try:
        from threadpoolctl import threadpool_info  # optional

        return ", ".join(f"{i.get('internal_api')} {i.get('num_threads')} threads" for i in threadpool_info())
    except ImportError:
        cfg = np.show_config(mode="dicts") if hasattr(np, "show_config") else {}
        try:
            return cfg["Build Dependencies"]["blas"]["name"]
        except (KeyError, TypeError):
            return "unknown BLAS"


# ------------------------------------------------------------------------------ output


def key_of(r):
    k = (r["name"], r["dtype"])
    if r["name"].startswith("matmul"):
        k = k + (r["shape"][0],)
    return k


def gemm_bar(r):
    """f32 matmul rows without an epilogue: judged against NumPy's BLAS."""
    return r["dtype"] == "f32" and r["name"] in ("matmul", "matmul a@b.t()", "matmul a.t()@b")


def verdicts(rows, numpy_ms):
    """(holds, judged) over every bar, the GEMM-vs-NumPy bars included."""
    holds = judged = 0
    for r in rows:
        p = r["pass"]
        np_ms = numpy_ms.get(key_of(r))
        if gemm_bar(r) and np_ms:
            p = np_ms / r["fused_ms"] >= 0.95
        if p is not None:
            judged += 1
            holds += p is True
    return holds, judged


def fmt(v, spec="{:.2f}", none="—"):
    return none if v is None else spec.format(v)


def build_table(meta, limits, rows, numpy_ms):
    """Markdown rows: kiln fused, unfused, NumPy, limit, ratios."""
    head = (
        "| workload | dtype | shape | kiln fused ms | kiln unfused ms | NumPy ms | limit ms (kind) "
        "| fused GB/s | of limit | unfused / fused | NumPy / fused | bar | measured | holds |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n"
    )
    lines = []
    for r in rows:
        k = key_of(r)
        np_ms = numpy_ms.get(k)
        gbs = r.get("limit_gbs")
        limit_ms = r["bytes"] / (gbs * 1e9) * 1e3 if gbs else None
        shape = "×".join(str(d) for d in r["shape"])
        if r["name"].startswith("matmul"):
            shape = f"{r['shape'][0]}³"
        of_limit = fmt(r["of_limit"] * 100 if r["of_limit"] is not None else None, "{:.0f}%")
        speed = r["unfused_ms"] / r["fused_ms"]
        np_ratio = np_ms / r["fused_ms"] if np_ms else None
        bar, value, passed = r["bar"], r["value"], r["pass"]
        if gemm_bar(r) and np_ratio:
            # The GEMM bar: at least 0.95x NumPy's GFLOP/s in the same run.
            bar, value, passed = ">= 0.95x NumPy GFLOP/s", f"{np_ratio:.2f}x", np_ratio >= 0.95
        holds = {True: "yes", False: "**no**", None: "—"}[passed]
        fused = f"{r['fused_ms']:.3f}"
        unfused = f"{r['unfused_ms']:.3f}"
        np_txt = fmt(np_ms, "{:.3f}")
        if r["name"].startswith("replay"):
            fused = f"{r['us_per_op']:.3f} µs/op"
            unfused = f"{r['unfused_us_per_op']:.3f} µs/op"
            np_txt = fmt(np_ms * 1e3 / 100 if np_ms else None, "{:.3f} µs/op")
            if r.get("miss_us_per_op") is not None:
                value += f" (miss {r['miss_us_per_op']:.2f} µs/op)"
        gb = f"{r['gbs']:.1f}" if r["limit"] != "-" else f"{r['gflops']:.0f} GFLOP/s"
        lines.append(
            f"| {r['name']} | {r['dtype']} | {shape} | {fused} | {unfused} | {np_txt} | "
            f"{fmt(limit_ms, '{:.2f}')} ({r['limit']}) | {gb} | {of_limit} | {speed:.2f}× | "
            f"{fmt(np_ratio, '{:.2f}×')} | {bar} | {value} | {holds} |"
        )
    return head + "\n".join(lines) + "\n"


def chart(plt, rows, limits, numpy_ms, cpu, path):
    mem = [r for r in rows if r["limit"] != "-"]
    other = [r for r in rows if r["limit"] == "-"]
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(13, 0.42 * len(mem) + 2.2), gridspec_kw={"width_ratios": [3, 2]}
    )
    labels = [f"{r['name']} {r['dtype']}" for r in mem]
    ys = range(len(mem))
    series = [
        ("kiln fused", [r["fused_ms"] for r in mem], "#1f77b4"),
        ("kiln unfused", [r["unfused_ms"] for r in mem], "#aec7e8"),
        ("NumPy", [numpy_ms.get(key_of(r)) for r in mem], "#ff7f0e"),
    ]
    h = 0.27
    for i, (name, vals, color) in enumerate(series):
        rel = []
        for r, v in zip(mem, vals):
            limit_ms = r["bytes"] / (r["limit_gbs"] * 1e9) * 1e3
            rel.append(v / limit_ms if v else 0)
        ax1.barh([y + (i - 1) * h for y in ys], rel, height=h, label=name, color=color)
    ax1.axvline(1.0, color="k", lw=1, ls="--", label="memory limit (same bytes)")
    ax1.set_xscale("log")
    ax1.set_yticks(list(ys))
    ax1.set_yticklabels(labels)
    ax1.invert_yaxis()
    ax1.set_xlabel("time / time at the measured limit (log; 1 = limit, lower is better)")
    ax1.legend(loc="lower right", fontsize=8)
    labels2 = []
    vals2 = {"kiln fused": [], "kiln unfused": [], "NumPy": []}
    for r in other:
        np_ms = numpy_ms.get(key_of(r))
        if r["name"].startswith("replay"):
            labels2.append("replay (µs/op ×100)")
            scale = lambda ms: ms * 1e3 / 100 * 100  # µs/op, ×100 to share the axis
        else:
            labels2.append(f"{r['name']} {r['dtype']} {r['shape'][0]}³ (ms)")
            scale = lambda ms: ms
        vals2["kiln fused"].append(scale(r["fused_ms"]))
        vals2["kiln unfused"].append(scale(r["unfused_ms"]))
        vals2["NumPy"].append(scale(np_ms) if np_ms else 0)
    ys2 = range(len(other))
    for i, (name, color) in enumerate(zip(vals2, ["#1f77b4", "#aec7e8", "#ff7f0e"])):
        ax2.barh([y + (i - 1) * h for y in ys2], vals2[name], height=h, label=name, color=color)
    ax2.set_yticks(list(ys2))
    ax2.set_yticklabels(labels2)
    ax2.invert_yaxis()
    ax2.set_xscale("log")
    ax2.xaxis.set_minor_formatter(plt.NullFormatter())
    ax2.set_xlabel("time (log; lower is better)")
    fig.suptitle(f"kiln vs NumPy, one run — {cpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_docs(section):
    text = open(DOC, encoding="utf-8").read() if os.path.exists(DOC) else "# Benchmarks\n"
    block = f"{BEGIN}\n{section}{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        at = text.find("\n## ")
        at = len(text) if at < 0 else at + 1
        text = text[:at] + block + "\n\n" + text[at:]
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    ensure_venv()
    import numpy as np

    args = sys.argv[1:]
    runs = 11
    write = True
    kiln_json = None
    extra = []
    i = 0
    while i < len(args):
        if args[i] == "--runs":
            runs = int(args[i + 1])
            i += 1
        elif args[i] == "--no-docs":
            write = False
        elif args[i] == "--kiln-json":
            kiln_json = args[i + 1]
            i += 1
        else:
            extra.append(args[i])
        i += 1
    cpu = lscpu()
    with open("/proc/loadavg") as f:
        load0 = " ".join(f.read().split()[:3])
    if kiln_json:
        objs = [json.loads(l) for l in open(kiln_json) if l.startswith("{")]
    else:
        objs = run_kiln(runs, extra)
    meta = next(o for o in objs if o["kind"] == "meta")
    limits = [o for o in objs if o["kind"] == "limit"]
    rows = [o for o in objs if o["kind"] == "workload"]
    numpy_ms = {}
    for key, (fn, ops) in numpy_workloads(np).items():
        reps = 200 if ops else 1
        if any(key_of(r) == key for r in rows):
            numpy_ms[key] = time_numpy(fn, runs, reps)
    with open("/proc/loadavg") as f:
        load1 = " ".join(f.read().split()[:3])
    table = build_table(meta, limits, rows, numpy_ms)
    lim_txt = ", ".join(f"{l['name']} {l['gbs']:.1f} GB/s" for l in limits)
    holds, judged = verdicts(rows, numpy_ms)
    section = (
        f"## Benchmark suite (`benches/compare.py`)\n\n"
        f"One run on {cpu}: kiln {meta['threads']} threads, SIMD {meta['simd']}; NumPy "
        f"{np.__version__} ({numpy_blas(np)}; elementwise ops and reductions on one thread). "
        f"Load average (1, 5, 15 min) {meta['load_start']} at the start of the kiln run, "
        f"{meta['load_end']} at its end, {load1} after NumPy's. Best of {meta['runs']} runs "
        f"after warm-up (the machine is shared, and a disturbed run is only ever slower); a kiln "
        f"run is a realize of a freshly recorded graph (recording untimed, plan from the cache; "
        f"the replay row times recording too), so unfused times include each intermediate's "
        f"allocation from the allocator cache. Limits: plain Rust loops over 64 MiB arrays on "
        f"every thread in the kiln process — copy, triad (`a = b + 1.5 c`) and read (a sum) — "
        f"{lim_txt} over the whole run; each workload is held against its own limit loop, run "
        f"right before each of its fused runs (best of those). Bytes moved = each input read "
        f"once plus the output written once; \"limit ms\" is those bytes at that limit's rate; "
        f"\"of limit\" is fused GB/s over that rate. Bars from the issue: {holds} of {judged} "
        f"hold in this run.\n\n"
        f"{table}\n"
        f"![kiln vs NumPy](benchmarks.png)\n\n"
        f"Rerun: `python3 benches/compare.py` (writes this section and the chart; "
        f"`--no-docs` only prints), or `cargo run --release --example bench` for kiln's table "
        f"alone.\n"
    )
    print(section)
    if write:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        chart(plt, rows, limits, numpy_ms, cpu, PNG)
        write_docs(section)
        print(f"wrote {DOC} and {PNG}", file=sys.stderr)


if __name__ == "__main__":
    main()
