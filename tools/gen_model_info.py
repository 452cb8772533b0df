#!/usr/bin/python3
"""gen_model_info.py - write the transfer-engine info of a real model's TP ranks.

For every tensor-parallel (TP) rank of a model served by sglang, writes the
JSON body that rank PUTs to /register_transfer_engine_info:

    {"rank": N,
     "transfer_engine_info": {
        "session_id": "127.0.0.1:<base_port + N>",
        "weights_info_dict": {"<param name>": [data_ptr, numel, element_size], ...}}}

Parameter names are sglang's fused names (qkv_proj, gate_up_proj), in the
order the model's named_parameters() yields them; numel is the size of the
rank's shard as sglang's tensor-parallel layers cut it; element_size is 2
(bf16); data_ptr values are device-like addresses, increasing and 256-byte
aligned, in a separate 64 GiB window per rank.

The shapes come from each model's public config.json (constants below), so
the output is what a real worker of that model registers, minus the real
addresses.  "stress" is a synthetic rank of 50,000 entries (about 4 MB of
JSON) with long, realistic MoE parameter names.

Standard library only.  Run with /usr/bin/python3.
"""

import argparse
import json
import os
import sys

ELEMENT_SIZE = 2            # bf16
ALIGN = 256                 # bytes; every tensor starts on this boundary
BASE_ADDR = 0x7F2A00000000  # device-like start of rank 0's window
RANK_STRIDE = 1 << 36       # 64 GiB between ranks' windows
VOCAB_PAD = 64              # sglang's DEFAULT_VOCAB_PADDING_SIZE
STRESS_ENTRIES = 50_000

# From the models' public config.json files.
MODELS = {
    "llama-3.1-8b": {
        "hf_name": "meta-llama/Llama-3.1-8B-Instruct",
        "layers": 32, "hidden": 4096, "intermediate": 14336,
        "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 128256,
        "qkv_bias": False, "tied_embeddings": False,
    },
    "qwen2.5-72b": {
        "hf_name": "Qwen/Qwen2.5-72B-Instruct",
        "layers": 80, "hidden": 8192, "intermediate": 29568,
        "heads": 64, "kv_heads": 8, "head_dim": 128, "vocab": 152064,
        "qkv_bias": True, "tied_embeddings": False,
    },
}
MODEL_CHOICES = sorted(MODELS) + ["stress"]


def ceil_div(a, b):
    return -(-a // b)


def align_up(value, align):
    return ceil_div(value, align) * align


def vocab_rows_per_rank(vocab, tp):
    """Rows of a vocab-parallel embedding / LM head on one rank.

    sglang pads the vocabulary to a multiple of 64 and splits the padded
    vocabulary evenly across TP ranks (VocabParallelEmbedding)."""
    padded = align_up(vocab, VOCAB_PAD)
    return ceil_div(padded, tp)


def heads_per_rank(cfg, tp):
    """(query heads, KV heads) on one rank, as QKVParallelLinear shards them.

    KV heads are replicated when TP exceeds their number."""
    if cfg["heads"] % tp:
        raise ValueError("TP %d does not divide %d attention heads" % (tp, cfg["heads"]))
    if cfg["intermediate"] % tp:
        raise ValueError("TP %d does not divide intermediate size %d" % (tp, cfg["intermediate"]))
    return cfg["heads"] // tp, max(1, cfg["kv_heads"] // tp)


def model_shapes(cfg, tp):
    """Yield (name, numel) of one rank's parameters, in named_parameters() order."""
    hidden, head_dim = cfg["hidden"], cfg["head_dim"]
    q_heads, kv_heads = heads_per_rank(cfg, tp)
    qkv_rows = (q_heads + 2 * kv_heads) * head_dim
    inter = cfg["intermediate"] // tp
    vocab_rows = vocab_rows_per_rank(cfg["vocab"], tp)

    yield "model.embed_tokens.weight", vocab_rows * hidden
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        yield p + "self_attn.qkv_proj.weight", qkv_rows * hidden
        if cfg["qkv_bias"]:
            yield p + "self_attn.qkv_proj.bias", qkv_rows
        yield p + "self_attn.o_proj.weight", hidden * q_heads * head_dim
        yield p + "mlp.gate_up_proj.weight", 2 * inter * hidden
        yield p + "mlp.down_proj.weight", hidden * inter
        yield p + "input_layernorm.weight", hidden
        yield p + "post_attention_layernorm.weight", hidden
    yield "model.norm.weight", hidden
    if not cfg["tied_embeddings"]:
        yield "lm_head.weight", vocab_rows * hidden


def stress_shapes(entries):
    """Yield (name, numel) of a synthetic MoE rank in the style of DeepSeek's
    checkpoints: attention, then 256 experts per layer, each with its own
    gate/up/down tensors and block scales, layer after layer, until `entries`
    names were made.  Shapes are small (hidden 2048, expert intermediate 192
    per rank) so the rank's weights fit its address window."""
    hidden, inter, experts = 2048, 192, 256

    def layer(i):
        p = "model.layers.%d." % i
        yield p + "self_attn.q_a_proj.weight", 1536 * hidden
        yield p + "self_attn.q_a_layernorm.weight", 1536
        yield p + "self_attn.q_b_proj.weight", 2 * 192 * 1536
        yield p + "self_attn.kv_a_proj_with_mqa.weight", 576 * hidden
        yield p + "self_attn.kv_a_layernorm.weight", 512
        yield p + "self_attn.kv_b_proj.weight", 2 * 256 * 512
        yield p + "self_attn.o_proj.weight", hidden * 2 * 128
        yield p + "mlp.gate.weight", experts * hidden
        yield p + "mlp.gate.e_score_correction_bias", experts
        for e in range(experts):
            q = "%smlp.experts.%d." % (p, e)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                yield q + proj + ".weight", inter * hidden
                yield q + proj + ".weight_scale_inv", ceil_div(inter, 128) * (hidden // 128)
        yield p + "input_layernorm.weight", hidden
        yield p + "post_attention_layernorm.weight", hidden

    made, i = 0, 0
    while True:
        for item in layer(i):
            if made == entries:
                return
            made += 1
            yield item
        i += 1


def layout(shapes, rank):
    """Turn (name, numel) pairs into weights_info_dict with device-like,
    increasing, 256-byte aligned data_ptr values in the rank's window.
    Returns (dict, bytes of weights)."""
    base = BASE_ADDR + rank * RANK_STRIDE
    ptr = base
    info = {}
    for name, numel in shapes:
        if name in info:
            raise ValueError("duplicate parameter name " + name)
        info[name] = [ptr, numel, ELEMENT_SIZE]
        ptr = align_up(ptr + numel * ELEMENT_SIZE, ALIGN)
    if ptr - base > RANK_STRIDE:
        raise ValueError("rank %d needs %d bytes, more than its %d-byte window"
                         % (rank, ptr - base, RANK_STRIDE))
    return info, sum(v[1] * v[2] for v in info.values())


def rank_body(model, rank, tp, base_port, stress_entries=STRESS_ENTRIES):
    """The /register_transfer_engine_info body of one rank, and its weight bytes."""
    if model == "stress":
        shapes = stress_shapes(stress_entries)
    else:
        shapes = model_shapes(MODELS[model], tp)
    info, nbytes = layout(shapes, rank)
    body = {
        "rank": rank,
        "transfer_engine_info": {
            "session_id": "127.0.0.1:%d" % (base_port + rank),
            "weights_info_dict": info,
        },
    }
    return body, nbytes


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
    return str(n)


def write_rank(out_dir, body):
    path = os.path.join(out_dir, "rank-%d.json" % body["rank"])
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        json.dump(body, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, path)
    return path


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="gen_model_info.py",
        description="Write the transfer-engine info (session_id and "
        "weights_info_dict) that each TP rank of an sglang worker registers "
        "for a real model, as rank-<N>.json files: each is exactly the body "
        "of PUT /register_transfer_engine_info.",
        epilog="Models: llama-3.1-8b (%s), qwen2.5-72b (%s), stress (synthetic "
        "rank of %d entries, about 4 MB of JSON). Example: "
        "gen_model_info.py --model qwen2.5-72b --tp 8 --out build/run/qwen2.5-72b. "
        "Exit status: 0 written, 1 a file could not be written, 2 usage error."
        % (MODELS["llama-3.1-8b"]["hf_name"], MODELS["qwen2.5-72b"]["hf_name"],
           STRESS_ENTRIES))
    ap.add_argument("--model", choices=MODEL_CHOICES, default="llama-3.1-8b",
                    help="model whose layout to write (default: %(default)s)")
    ap.add_argument("--tp", type=int, default=8,
                    help="tensor-parallel size: number of ranks written (default: %(default)s)")
    ap.add_argument("--base-port", type=int, default=16000,
                    help="rank N's session_id is 127.0.0.1:<base-port + N> (default: %(default)s)")
    ap.add_argument("--entries", type=int, default=STRESS_ENTRIES,
                    help="entries per rank for --model stress (default: %(default)s)")
    ap.add_argument("--out", required=True, metavar="DIR",
                    help="directory to write rank-<N>.json into (created if missing)")
    ap.add_argument("--quiet", action="store_true", help="print no summary lines")
    args = ap.parse_args(argv)
    if args.tp < 1 or args.tp > 1024:
        ap.error("--tp must be 1..1024")
    if args.base_port < 1 or args.base_port + args.tp - 1 > 65535:
        ap.error("--base-port: ports base..base+tp-1 must lie in 1..65535")
    if args.entries < 1:
        ap.error("--entries must be positive")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        os.makedirs(args.out, exist_ok=True)
        for rank in range(args.tp):
            body, nbytes = rank_body(args.model, rank, args.tp, args.base_port, args.entries)
            path = write_rank(args.out, body)
            if not args.quiet:
                info = body["transfer_engine_info"]
                print("%s rank %d: %d entries, %d bytes of weights (%s), a %d-byte file "
                      "(the PUT body), session_id %s -> %s"
                      % (args.model, rank, len(info["weights_info_dict"]), nbytes,
                         human_bytes(nbytes), os.path.getsize(path), info["session_id"], path))
    except (OSError, ValueError) as e:
        print("gen_model_info.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
