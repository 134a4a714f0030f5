#!/usr/bin/env python3
"""Writes a Hugging Face Llama model directory as one GGUF file, for llama.cpp.

    scripts/hf_to_gguf.py MODEL_DIR OUT.gguf [--f16]

--f16 stores bf16 matrices as f16 (exact for values in f16's range; llama.cpp's CPU
build runs f16 faster than bf16 on some machines).

Only what scripts/compare-llamacpp.sh needs, with the standard library alone: Llama
architectures (LlamaForCausalLM, MistralForCausalLM without a sliding window), weights
as stored (bf16, f16 or f32; norms as f32), q and k rows permuted to llama.cpp's rotary
layout as its own converter does, and a byte-level BPE tokenizer.json (with its merges,
added tokens and the chat template) as a "gpt2" vocabulary with Llama 3's
pre-tokenizer. Anything else is refused by name.
"""
import json
import os
import struct
import sys

GGML_TYPES = {"F32": 0, "F16": 1, "BF16": 30}
ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
ALIGN = 32
# GGUF value types
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def fail(what):
    sys.exit(f"hf_to_gguf: {what}")


def gguf_string(text):
    b = text.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_pair(key, vtype, payload):
    return gguf_string(key) + struct.pack("<I", vtype) + payload


def u32(key, v):
    return kv_pair(key, U32, struct.pack("<I", v))


def f32(key, v):
    return kv_pair(key, F32, struct.pack("<f", v))


def string(key, v):
    return kv_pair(key, STRING, gguf_string(v))


def array(key, etype, items):
    if etype == STRING:
        body = b"".join(gguf_string(s) for s in items)
    else:
        body = struct.pack(f"<{len(items)}{'i' if etype == I32 else 'f'}", *items)
    return kv_pair(key, ARRAY, struct.pack("<IQ", etype, len(items)) + body)


class SafeTensors:
    """The tensors of model.safetensors, or of the shards model.safetensors.index.json lists."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(
            index) else ["model.safetensors"]
        self.tensors = {}
        for name in files:
            path = os.path.join(model_dir, name)
            with open(path, "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
            for tensor, info in header.items():
                if tensor != "__metadata__":
                    self.tensors[tensor] = (path, 8 + size, info)

    def info(self, name):
        if name not in self.tensors:
            fail(f"the model has no tensor {name}")
        info = self.tensors[name][2]
        if info["dtype"] not in GGML_TYPES:
            fail(f"{name}: dtype {info['dtype']} is not bf16, f16 or f32")
        return info["dtype"], info["shape"]

    def get(self, name):
        self.info(name)
        path, base, info = self.tensors[name]
        begin, end = info["data_offsets"]
        with open(path, "rb") as f:
            f.seek(base + begin)
            data = f.read(end - begin)
        return info["dtype"], info["shape"], data


def to_f32(dtype, data):
    """A 16-bit vector as float32 bytes (exact)."""
    if dtype == "F32":
        return data
    n = len(data) // 2
    halves = struct.unpack(f"<{n}H", data)
    if dtype == "BF16":
        return struct.pack(f"<{n}I", *(h << 16 for h in halves))
    return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", data))


def bf16_to_f16(data):
    """bf16 values rounded to f16 (nearest even; exact unless outside f16's range)."""
    try:
        import numpy as np
        bits = np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float16).tobytes()
    except ImportError:
        n = len(data) // 2
        values = struct.unpack(f"<{n}f", struct.pack(f"<{n}I", *(
            h << 16 for h in struct.unpack(f"<{n}H", data))))
        return struct.pack(f"<{n}e", *values)


def permute_rows(data, shape, dtype, heads):
    """llama.cpp's rotary layout: within each head, rows (i, i + d/2) become (2i, 2i + 1)."""
    rows, cols = shape
    row_bytes = cols * ELEMENT_BYTES[dtype]
    head_dim = rows // heads
    half = head_dim // 2
    out = []
    for h in range(heads):
        for i in range(half):
            for t in (0, 1):
                r = h * head_dim + t * half + i
                out.append(data[r * row_bytes:(r + 1) * row_bytes])
    return b"".join(out)


def vocabulary(model_dir, config):
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    model = tok["model"]
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if model.get("type") != "BPE" or "ByteLevel" not in kinds:
        fail("only byte-level BPE tokenizers are supported")
    splits = [step.get("pattern", {}).get("Regex") for step in steps if step.get("type") == "Split"]
    if splits != [LLAMA3_SPLIT]:
        fail("the pre-tokenizer is not Llama 3's split pattern")
    vocab = dict(model["vocab"])
    special = {}
    for t in tok.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        special[t["id"]] = t.get("special", False)
    size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [5] * size  # unused
    for text, i in vocab.items():
        if i < size:
            tokens[i] = text
            types[i] = 1  # normal
    for i, is_special in special.items():
        if i < size:
            types[i] = 3 if is_special else 4  # control, user-defined
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out = [string("tokenizer.ggml.model", "gpt2"), string("tokenizer.ggml.pre", "llama-bpe"),
           array("tokenizer.ggml.tokens", STRING, tokens),
           array("tokenizer.ggml.token_type", I32, types),
           array("tokenizer.ggml.merges", STRING, merges)]
    for key, field in (("bos", "bos_token_id"), ("eos", "eos_token_id")):
        v = config.get(field)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None:
            out.append(u32(f"tokenizer.ggml.{key}_token_id", v))
    tc_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(tc_path):
        template = json.load(open(tc_path)).get("chat_template")
        if isinstance(template, str):
            out.append(string("tokenizer.chat_template", template))
    return out


def main():
    args = [a for a in sys.argv[1:] if a != "--f16"]
    as_f16 = len(args) < len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__)
    model_dir, out_path = args
    config = json.load(open(os.path.join(model_dir, "config.json")))
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM"):
        fail(f"architecture {arch} is not supported")
    if config.get("rope_scaling") or config.get("rope_parameters"):
        fail("rope_scaling is not supported")
    if config.get("sliding_window"):
        fail("sliding_window is not supported")
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads")
    kv_heads = kv_heads or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    layers = config["num_hidden_layers"]

    meta = [string("general.architecture", "llama"),
            string("general.name", os.path.basename(os.path.abspath(model_dir))),
            u32("general.alignment", ALIGN),
            u32("llama.context_length", config["max_position_embeddings"]),
            u32("llama.embedding_length", config["hidden_size"]),
            u32("llama.block_count", layers),
            u32("llama.feed_forward_length", config["intermediate_size"]),
            u32("llama.attention.head_count", heads),
            u32("llama.attention.head_count_kv", kv_heads),
            u32("llama.attention.key_length", head_dim),
            u32("llama.attention.value_length", head_dim),
            u32("llama.rope.dimension_count", head_dim),
            f32("llama.rope.freq_base", config.get("rope_theta", 10000.0)),
            f32("llama.attention.layer_norm_rms_epsilon", config["rms_norm_eps"]),
            u32("llama.vocab_size", config["vocab_size"])]
    meta += vocabulary(model_dir, config)

    st = SafeTensors(model_dir)
    names = [("model.embed_tokens.weight", "token_embd.weight", 0)]
    for i in range(layers):
        p = f"model.layers.{i}."
        names += [(p + "input_layernorm.weight", f"blk.{i}.attn_norm.weight", 0),
                  (p + "self_attn.q_proj.weight", f"blk.{i}.attn_q.weight", heads),
                  (p + "self_attn.k_proj.weight", f"blk.{i}.attn_k.weight", kv_heads),
                  (p + "self_attn.v_proj.weight", f"blk.{i}.attn_v.weight", 0),
                  (p + "self_attn.o_proj.weight", f"blk.{i}.attn_output.weight", 0),
                  (p + "post_attention_layernorm.weight", f"blk.{i}.ffn_norm.weight", 0),
                  (p + "mlp.gate_proj.weight", f"blk.{i}.ffn_gate.weight", 0),
                  (p + "mlp.up_proj.weight", f"blk.{i}.ffn_up.weight", 0),
                  (p + "mlp.down_proj.weight", f"blk.{i}.ffn_down.weight", 0)]
    names.append(("model.norm.weight", "output_norm.weight", 0))
    if not config.get("tie_word_embeddings", False):
        names.append(("lm_head.weight", "output.weight", 0))

    infos, offset, sizes = [], 0, []
    for hf, gg, permute_heads in names:
        dtype, shape = st.info(hf)
        if len(shape) == 1:
            dtype = "F32"
        elif as_f16 and dtype == "BF16":
            dtype = "F16"
        size = ELEMENT_BYTES[dtype]
        for n in shape:
            size *= n
        dims = list(reversed(shape))
        infos.append(gguf_string(gg) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", n) for n in dims) +
                     struct.pack("<IQ", GGML_TYPES[dtype], offset))
        sizes.append(size)
        offset += size + (-size) % ALIGN

    header = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta) + b"".join(
        infos)
    with open(out_path, "wb") as f:
        f.write(header + b"\0" * ((-len(header)) % ALIGN))
        for (hf, gg, permute_heads), size in zip(names, sizes):
            dtype, shape, data = st.get(hf)
            if len(shape) == 1:
                data = to_f32(dtype, data)
            else:
                if permute_heads:
                    data = permute_rows(data, shape, dtype, permute_heads)
                if as_f16 and dtype == "BF16":
                    data = bf16_to_f16(data)
            assert len(data) == size, gg
            f.write(data + b"\0" * ((-size) % ALIGN))
    print(f"{out_path}: {len(infos)} tensors, {offset / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
