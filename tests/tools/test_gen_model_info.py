#!/usr/bin/python3
"""Tests of tools/gen_model_info.py: the transfer-engine info it writes must be
what sglang's TP workers of the real models register.

Usage: test_gen_model_info.py --gen PATH/gen_model_info.py --work DIR [unittest args]
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import unittest

ARGS = None
TP = 8

# Parameter counts of the Hugging Face checkpoints (config.json shapes):
# Llama-3.1-8B: 8,030,261,248 ("8.03B"); Qwen2.5-72B: 72,706,203,648 ("72.7B").
KNOWN_PARAMS = {"llama-3.1-8b": 8_030_261_248, "qwen2.5-72b": 72_706_203_648}
# Fused sglang names per decoder layer: qkv_proj (+ bias), o_proj, gate_up_proj,
# down_proj, two norms; plus embed_tokens, model.norm and an untied lm_head.
PER_LAYER = {"llama-3.1-8b": (32, 6), "qwen2.5-72b": (80, 7)}
REPLICATED = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight")


def load_gen_module():
    spec = importlib.util.spec_from_file_location("gen_model_info", ARGS.gen)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def generate(model, out, *extra):
    if os.path.isdir(out):
        shutil.rmtree(out)
    proc = subprocess.run([sys.executable, ARGS.gen, "--model", model, "--out", out] + list(extra),
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise AssertionError("generator failed (%d): %s" % (proc.returncode, proc.stderr))
    return proc.stdout


def read_ranks(out, tp):
    ranks = []
    for r in range(tp):
        with open(os.path.join(out, "rank-%d.json" % r), encoding="utf-8") as f:
            ranks.append(json.load(f))
    return ranks


class ModelLayoutTest(unittest.TestCase):
    """The two real models, TP 8."""

    @classmethod
    def setUpClass(cls):
        cls.ranks = {}
        cls.stdout = {}
        for model in KNOWN_PARAMS:
            out = os.path.join(ARGS.work, model)
            cls.stdout[model] = generate(model, out)
            cls.ranks[model] = read_ranks(out, TP)

    def test_body_shape(self):
        for model, ranks in self.ranks.items():
            for r, body in enumerate(ranks):
                self.assertEqual(set(body), {"rank", "transfer_engine_info"})
                self.assertEqual(body["rank"], r)
                tei = body["transfer_engine_info"]
                self.assertEqual(set(tei), {"session_id", "weights_info_dict"})
                self.assertEqual(tei["session_id"], "127.0.0.1:%d" % (16000 + r), model)

    def test_entry_counts(self):
        for model, (layers, per_layer) in PER_LAYER.items():
            for body in self.ranks[model]:
                d = body["transfer_engine_info"]["weights_info_dict"]
                self.assertEqual(len(d), layers * per_layer + 3, model)
        self.assertEqual(len(self.ranks["llama-3.1-8b"][0]["transfer_engine_info"]
                             ["weights_info_dict"]), 195)
        self.assertEqual(len(self.ranks["qwen2.5-72b"][0]["transfer_engine_info"]
                             ["weights_info_dict"]), 563)

    def test_sglang_names(self):
        d = self.ranks["qwen2.5-72b"][0]["transfer_engine_info"]["weights_info_dict"]
        names = list(d)
        self.assertEqual(names[0], "model.embed_tokens.weight")
        self.assertEqual(names[-2:], ["model.norm.weight", "lm_head.weight"])
        for i in (0, 79):
            for suffix in ("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias",
                           "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
                           "mlp.down_proj.weight", "input_layernorm.weight",
                           "post_attention_layernorm.weight"):
                self.assertIn("model.layers.%d.%s" % (i, suffix), d)
        llama = self.ranks["llama-3.1-8b"][0]["transfer_engine_info"]["weights_info_dict"]
        self.assertNotIn("model.layers.0.self_attn.qkv_proj.bias", llama)
        self.assertFalse(any(".q_proj." in n or ".gate_proj." in n for n in llama))

    def test_shard_shapes_llama(self):
        d = self.ranks["llama-3.1-8b"][3]["transfer_engine_info"]["weights_info_dict"]
        numel = {k: v[1] for k, v in d.items()}
        p = "model.layers.7."
        self.assertEqual(numel[p + "self_attn.qkv_proj.weight"], (4 + 2 * 1) * 128 * 4096)
        self.assertEqual(numel[p + "self_attn.o_proj.weight"], 4096 * 4 * 128)
        self.assertEqual(numel[p + "mlp.gate_up_proj.weight"], 2 * 1792 * 4096)
        self.assertEqual(numel[p + "mlp.down_proj.weight"], 4096 * 1792)
        self.assertEqual(numel[p + "input_layernorm.weight"], 4096)
        self.assertEqual(numel["model.embed_tokens.weight"], 16032 * 4096)
        self.assertEqual(numel["lm_head.weight"], 16032 * 4096)

    def test_parameter_count(self):
        """Sharded tensors summed over the TP ranks, replicated ones counted
        once, give the checkpoint's parameter count."""
        for model, ranks in self.ranks.items():
            total = 0
            for r, body in enumerate(ranks):
                for name, (_, numel, _) in body["transfer_engine_info"]["weights_info_dict"].items():
                    if name.endswith(REPLICATED):
                        total += numel if r == 0 else 0
                    else:
                        total += numel
            known = KNOWN_PARAMS[model]
            # Vocab padding to 64 may only add rows (none for these vocab sizes).
            self.assertGreaterEqual(total, known, model)
            self.assertLess(total - known, 2 * 64 * 8192, model)
            self.assertEqual(total, known, model)
        self.assertAlmostEqual(KNOWN_PARAMS["llama-3.1-8b"] / 1e9, 8.03, places=2)
        self.assertAlmostEqual(KNOWN_PARAMS["qwen2.5-72b"] / 1e9, 72.7, places=1)

    def test_addresses(self):
        """bf16, 256-byte aligned, increasing, non-overlapping, device-like,
        and every rank in its own window."""
        for model, ranks in self.ranks.items():
            windows = []
            for body in ranks:
                entries = list(body["transfer_engine_info"]["weights_info_dict"].values())
                prev_end = 0
                for ptr, numel, esize in entries:
                    self.assertEqual(esize, 2, model)
                    self.assertGreater(numel, 0, model)
                    self.assertEqual(ptr % 256, 0, model)
                    self.assertGreaterEqual(ptr, prev_end, model)
                    self.assertLess(ptr, 1 << 48, model)
                    self.assertGreaterEqual(ptr, 0x7F0000000000, model)
                    prev_end = ptr + numel * esize
                windows.append((entries[0][0], prev_end))
            windows.sort()
            for a, b in zip(windows, windows[1:]):
                self.assertLessEqual(a[1], b[0], model)

    def test_summary_lines(self):
        for model, out in self.stdout.items():
            lines = out.strip().splitlines()
            self.assertEqual(len(lines), TP)
            self.assertIn("rank 0: ", lines[0])
            self.assertIn(" entries, ", lines[0])
            self.assertIn(" bytes of weights", lines[0])
            self.assertIn("-byte file (the PUT body)", lines[0])


class StressTest(unittest.TestCase):
    def test_stress_rank(self):
        out = os.path.join(ARGS.work, "stress")
        generate("stress", out, "--tp", "2")
        size = os.path.getsize(os.path.join(out, "rank-0.json"))
        body = read_ranks(out, 2)[0]
        d = body["transfer_engine_info"]["weights_info_dict"]
        self.assertGreaterEqual(len(d), 50_000)
        self.assertGreater(size, 3_500_000)
        self.assertLess(size, 6_000_000)
        prev_end = 0
        for ptr, numel, esize in d.values():
            self.assertEqual(ptr % 256, 0)
            self.assertGreaterEqual(ptr, prev_end)
            self.assertEqual(esize, 2)
            prev_end = ptr + numel * esize


class HelpersAndCliTest(unittest.TestCase):
    def test_vocab_padding(self):
        gen = load_gen_module()
        self.assertEqual(gen.vocab_rows_per_rank(128256, 8), 16032)
        self.assertEqual(gen.vocab_rows_per_rank(152064, 8), 19008)
        self.assertEqual(gen.vocab_rows_per_rank(100, 8), 16)       # 100 -> 128 -> 16
        self.assertEqual(gen.vocab_rows_per_rank(32001, 1), 32064)

    def test_kv_heads_replicated_beyond_their_count(self):
        gen = load_gen_module()
        self.assertEqual(gen.heads_per_rank(gen.MODELS["llama-3.1-8b"], 16), (2, 1))

    def test_tp_and_base_port(self):
        out = os.path.join(ARGS.work, "tp2")
        generate("llama-3.1-8b", out, "--tp", "2", "--base-port", "20000", "--quiet")
        self.assertEqual(sorted(os.listdir(out)), ["rank-0.json", "rank-1.json"])
        body = read_ranks(out, 2)[1]
        self.assertEqual(body["transfer_engine_info"]["session_id"], "127.0.0.1:20001")
        qkv = body["transfer_engine_info"]["weights_info_dict"]["model.layers.0.self_attn.qkv_proj.weight"]
        self.assertEqual(qkv[1], (16 + 2 * 4) * 128 * 4096)

    def test_usage_errors(self):
        for extra in (["--tp", "0"], ["--model", "gpt-5"], ["--tp", "3"]):
            proc = subprocess.run([sys.executable, ARGS.gen, "--out",
                                   os.path.join(ARGS.work, "bad")] + extra,
                                  capture_output=True, text=True, timeout=60, check=False)
            self.assertNotEqual(proc.returncode, 0, extra)
            self.assertTrue(proc.stderr.strip(), extra)
        proc = subprocess.run([sys.executable, ARGS.gen, "--help"], capture_output=True,
                              text=True, timeout=60, check=False)
        self.assertEqual(proc.returncode, 0)
        self.assertIn("--model", proc.stdout)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--gen", required=True)
    ap.add_argument("--work", required=True)
    ARGS, rest = ap.parse_known_args()
    os.makedirs(ARGS.work, exist_ok=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
