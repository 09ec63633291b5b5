"""The table of against_llama_bench.sh: per model, median [min-max] over the rounds of each tool,
Spindle / llama.cpp, and the decode roofline from the GGUF's weight bytes and the measured bandwidth.
Usage: summarize_llama_bench.py RESULTS.tsv BANDWIDTH_GBPS PROMPT DECODE DEPTHS DEPTH_PROMPT DEPTH_DECODE
CONCURRENT (DEPTHS comma-separated). An "agent prompt" row holds seconds (less is better); Spindle's
share of llama-server's time is printed for it."""
import statistics
import struct
import sys
from collections import defaultdict


def weight_bytes_per_token(path):
    """Bytes of every tensor a decode step reads: all but the token embeddings (one row is read
    per token), which count only when the output head is tied to them (no output.weight)."""
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def string():
            return f.read(read("Q")).decode("utf-8", "replace")

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def value(kind):
            if kind == 8:
                return string()
            if kind == 9:
                item, count = read("I"), read("Q")
                return [value(item) for _ in range(count)]
            return read(scalar[kind])

        assert f.read(4) == b"GGUF", f"{path} is not a GGUF file"
        read("I")
        tensors, kvs = read("Q"), read("Q")
        alignment, meta = 32, {}
        for _ in range(kvs):
            key, kind = string(), read("I")
            meta[key] = value(kind)
        alignment = meta.get("general.alignment", alignment)
        infos = []
        for _ in range(tensors):
            name = string()
            dims = read("I")
            for _ in range(dims):
                read("Q")
            read("I")
            infos.append((read("Q"), name))
        data_start = -(-f.tell() // alignment) * alignment
        f.seek(0, 2)
        data_end = f.tell() - data_start
    infos.sort()
    sizes = {name: end - offset for (offset, name), end in zip(infos, [o for o, _ in infos[1:]] + [data_end])}
    # A mixture of experts reads only the experts its router picks: the used share of each
    # stacked expert tensor (*_exps), on average.
    count = next((v for k, v in meta.items() if k.endswith(".expert_count")), 0)
    used = next((v for k, v in meta.items() if k.endswith(".expert_used_count")), 0)
    share = used / count if count else 1.0
    total = sum(size * share if "_exps." in name else size for name, size in sizes.items())
    embeddings = sizes.get("token_embd.weight", 0)
    return total if "output.weight" not in sizes else total - embeddings


def cell(values):
    if not values:
        return "-", None
    med = statistics.median(values)
    return f"{med:.1f} [{min(values):.1f}-{max(values):.1f}]", med


def main():
    results, bandwidth = sys.argv[1], float(sys.argv[2])
    pp, tg, depths, depth_pp, depth_tg, npl = sys.argv[3:9]
    values, gguf = defaultdict(list), {}
    for line in open(results):
        tool, model, *rest = line.rstrip("\n").split("\t")
        if tool == "gguf":
            gguf[model] = rest[0]
            continue
        metric, value = rest
        if value:
            # RSS comes in KiB; shown in MiB.
            values[tool, model, metric].append(float(value) / 1024 if metric.startswith("rss") else float(value))
    rows = [("prefill", f"prefill pp{pp} tok/s"), ("decode", f"decode tg{tg} tok/s")]
    for depth in depths.split(","):
        rows += [
            (f"prefill @ d{depth}", f"prefill pp{depth_pp} @ d{depth} tok/s"),
            (f"decode @ d{depth}", f"decode tg{depth_tg} @ d{depth} tok/s"),
        ]
    rows += [
        ("concurrent decode", f"aggregate decode {npl} seqs tok/s"),
        ("agent prompt", "agent prompt ~17.7K cold, s"),
        ("rss", f"peak RSS MiB, pp{pp} + tg{tg} run"),
        ("rss @ depth", "peak RSS MiB, depth runs"),
        ("rss concurrent", f"peak RSS MiB, {npl}-seq run"),
    ]
    for model, path in gguf.items():
        print(f"\n== {model}  ({path})")
        print(f"{'measure':<34} {'llama.cpp med [min-max]':>26} {'Spindle med [min-max]':>26} {'Spindle/llama':>14}")
        for metric, label in rows:
            if not values["llama", model, metric] and not values["spindle", model, metric]:
                continue
            (llama_text, llama), (ours_text, ours) = cell(values["llama", model, metric]), cell(values["spindle", model, metric])
            ratio = f"{ours / llama:.2f}x" if llama and ours else "-"
            print(f"{label:<34} {llama_text:>26} {ours_text:>26} {ratio:>14}")
        weights = weight_bytes_per_token(path)
        ceiling = bandwidth * 1e9 / weights
        _, llama = cell(values["llama", model, "decode"])
        _, ours = cell(values["spindle", model, "decode"])
        shares = ", ".join(f"{name} at {speed / ceiling:.0%}" for name, speed in [("llama.cpp", llama), ("Spindle", ours)] if speed)
        print(f"decode roofline: {weights / 2**20:.1f} MiB of weights per token / {bandwidth:.1f} GB/s = {ceiling:.0f} tok/s ({shares})")


main()
