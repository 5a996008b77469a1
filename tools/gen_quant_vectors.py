#!/usr/bin/env python3
"""Generate ops/tests/data/quant_vectors.bin: test vectors for pn-ops' quant module.

Run from the repository root (needs gguf-py + numpy):
    /tmp/pyenv/bin/python tools/gen_quant_vectors.py

Contents (all seeded, so the output is reproducible):
  * kind 0 (dequantize): random blocks of every supported block format (random bytes,
    with the f16/f32/E8M0 scale fields replaced by finite values, subnormals included),
    plus the first rows of a few tensors of the fixture GGUFs in tests/fixtures/.
    Expected values come from gguf-py's `gguf.quants.dequantize` (Q8_K, which gguf-py
    lacks, is computed as `d * qs` in numpy float32).
  * kind 1 (quantize): f32 rows and the bytes ggml's x86 activation quantizers produce
    (Q8_0 / Q8_1: AVX path, id = 127/amax, round half to even, d stored as f16; Q8_K:
    quantize_row_q8_K_ref; F16 / BF16: round to nearest even), mirrored in numpy,
    including ties at .5 and all-zero blocks.

Binary format (little endian):
  magic b"PNQV", u32 version (1), u32 record count, then per record:
  u8 kind, u8 name_len, name (utf-8), u32 ggml type id, u32 n (elements),
  u32 nbytes, nbytes of block data, n f32 values
  (kind 0: the blocks and their expected dequantization;
   kind 1: the expected quantized bytes and the f32 input row).
"""
import os
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf import quants as gq
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "ops", "tests", "data", "quant_vectors.bin")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

F32 = np.float32

# f16 scale-field offsets per block (random bytes elsewhere).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0],
    T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
}
BLOCK_TYPES = list(F16_FIELDS) + [T.IQ1_M, T.MXFP4, T.Q8_K]


def rand_f16(rng: np.random.Generator) -> int:
    r = rng.random()
    if r < 0.1:  # subnormal f16
        bits = int(rng.integers(1, 0x400))
    elif r < 0.15:
        bits = 0
    else:
        bits = int(np.float16(np.exp2(rng.uniform(-14, 4))).view(np.uint16))
    if rng.random() < 0.3:
        bits |= 0x8000
    return bits


def random_blocks(rng: np.random.Generator, t: T, nblocks: int) -> bytes:
    bs, ts = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    for b in range(nblocks):
        for off in F16_FIELDS.get(t, []):
            raw[b, off:off + 2] = np.frombuffer(struct.pack("<H", rand_f16(rng)), np.uint8)
        if t == T.IQ1_M:  # the f16 d lives in the top nibble of the 4 scale words
            d = rand_f16(rng)
            for i in range(4):
                w = struct.unpack_from("<H", raw[b].tobytes(), 48 + 2 * i)[0]
                w = (w & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
                raw[b, 48 + 2 * i:50 + 2 * i] = np.frombuffer(struct.pack("<H", w), np.uint8)
        if t == T.MXFP4:
            raw[b, 0] = [0, 1, 2, 127, 128, 100, 140, 250][b % 8] if b < 8 else rng.integers(0, 251)
        if t == T.Q8_K:
            d = F32(np.exp2(rng.uniform(-20, 0)) * (1 if rng.random() < 0.7 else -1))
            raw[b, 0:4] = np.frombuffer(d.tobytes(), np.uint8)
    return raw.tobytes()


def dequant(t: T, data: bytes) -> np.ndarray:
    arr = np.frombuffer(data, dtype=np.uint8)
    if t == T.Q8_K:
        blk = arr.reshape(-1, 292)
        d = blk[:, 0:4].copy().view(F32)
        qs = blk[:, 4:260].copy().view(np.int8).astype(F32)
        return (d * qs).reshape(-1).astype(F32)
    if t == T.BF16:
        return gq.dequantize(arr.reshape(1, -1), t).reshape(-1).astype(F32)
    if t in (T.F32, T.F16):
        return gq.dequantize(arr, t).reshape(-1).astype(F32)
    bs, ts = GGML_QUANT_SIZES[t]
    return gq.dequantize(arr.reshape(-1, ts), t).reshape(-1).astype(F32)


# ---- numpy mirrors of ggml's activation quantizers -------------------------------------

def q8_0_x86(x: np.ndarray, with_sum: bool) -> bytes:
    out = b""
    for blk in x.astype(F32).reshape(-1, 32):
        amax = F32(np.max(np.abs(blk)))
        d = F32(amax / F32(127))
        inv = F32(F32(127) / amax) if amax != 0 else F32(0)
        q = np.clip(np.rint(blk * inv), -128, 127).astype(np.int8)
        out += np.float16(d).tobytes()
        if with_sum:
            out += np.float16(F32(d * F32(int(q.astype(np.int32).sum())))).tobytes()
        out += q.tobytes()
    return out


def q8_k_ref(x: np.ndarray) -> bytes:
    out = b""
    for blk in x.astype(F32).reshape(-1, 256):
        i = int(np.argmax(np.abs(blk)))  # first maximum, as the strict `>` in ggml
        mx = blk[i]
        if np.abs(mx) == 0:
            out += bytes(292)
            continue
        iscale = F32(F32(-127) / mx)
        q = np.minimum(np.rint(F32(iscale) * blk), 127).astype(np.int8)
        bsums = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
        out += F32(F32(1) / iscale).tobytes() + q.tobytes() + bsums.tobytes()
    return out


def f16_rne(x: np.ndarray) -> bytes:
    return x.astype(F32).astype(np.float16).tobytes()


def bf16_rne(x: np.ndarray) -> bytes:
    return gq.BF16.quantize_blocks(x.astype(F32).reshape(1, -1)).tobytes()


def activation_rows(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    rows = []
    rows.append(("normal", rng.standard_normal(512).astype(F32)))
    rows.append(("wide", (rng.standard_normal(512) * np.exp2(rng.integers(-30, 30, 512))).astype(F32)))
    ties = np.zeros(512, F32)
    # Q8_0 blocks whose amax is 127: id = 1 exactly, so the .5 values are ties.
    vals = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5, 126.5, -126.5, 64.5, 0.0], F32)
    for b in range(4):
        blk = rng.choice(vals, 32).astype(F32)
        blk[b] = F32(127) if b % 2 == 0 else F32(-127)
        ties[32 * b:32 * b + 32] = blk
    # 32..: block 4 all zero (also a zero Q8_0 block); second Q8_K super-block: signed max
    # -127 (iscale = +1) with .5 ties.
    blk = rng.choice(vals, 256).astype(F32)
    blk[7] = F32(-127)
    ties[256:] = blk
    rows.append(("ties", ties))
    rows.append(("zeros", np.zeros(512, F32)))
    pos = np.abs(rng.standard_normal(512)).astype(F32)  # Q8_K with a positive max
    pos[100] = F32(-1e-3)
    rows.append(("positive", pos))
    # tiny (but normal) values: 127/amax stays finite, the f16 d underflows
    rows.append(("tiny", (rng.standard_normal(512) * F32(1e-35)).astype(F32)))
    # values that stress f16/bf16 rounding: exact halfway points between representables
    half = (np.float16(rng.standard_normal(512)).astype(F32))
    half = half + np.abs(half) * F32(2.0 ** -11)
    rows.append(("f16-halfway", half.astype(F32)))
    return rows


def main() -> None:
    rng = np.random.default_rng(20240601)
    recs = []

    def add(kind: int, name: str, t: T, n: int, data: bytes, floats: np.ndarray) -> None:
        floats = np.asarray(floats, dtype=F32).reshape(-1)
        assert floats.size == n, (name, floats.size, n)
        nb = name.encode()
        recs.append(struct.pack("<BB", kind, len(nb)) + nb + struct.pack("<III", int(t), n, len(data)) + data + floats.tobytes())

    # random blocks of every block format
    for t in BLOCK_TYPES:
        bs, ts = GGML_QUANT_SIZES[t]
        nblocks = 12 if bs == 32 else 3
        data = random_blocks(rng, t, nblocks)
        add(0, f"random/{t.name}", t, nblocks * bs, data, dequant(t, data))
    # scalar types
    f32 = (rng.standard_normal(64) * np.exp2(rng.integers(-140, 120, 64))).astype(F32)
    add(0, "random/F32", T.F32, 64, f32.tobytes(), f32)
    h = rng.integers(0, 0x10000, 256, dtype=np.uint16)
    h = h[(h & 0x7C00) != 0x7C00][:128]  # no NaN / Inf payload games
    h = np.concatenate([h, np.array([0x0001, 0x83FF, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x7BFF, 0x0400], np.uint16)])
    add(0, "random/F16", T.F16, h.size, h.tobytes(), dequant(T.F16, h.tobytes()))
    b = rng.integers(0, 0x10000, 256, dtype=np.uint16)
    b = b[(b & 0x7F80) != 0x7F80][:128]
    b = np.concatenate([b, np.array([0x0001, 0x807F, 0x7F80, 0xFF80, 0x0000, 0x8000], np.uint16)])
    add(0, "random/BF16", T.BF16, b.size, b.tobytes(), dequant(T.BF16, b.tobytes()))

    # first rows of fixture tensors
    fixtures = [
        ("ktiny-q4_k_m", ["Q4_K", "Q6_K"]), ("ktiny-q5_k_m", ["Q5_K"]), ("ktiny-iq3_s", ["IQ3_S"]),
        ("ktiny-iq4_xs", ["IQ4_XS"]), ("ktiny-mxfp4", ["MXFP4", "Q8_0"]), ("tiny-q4_0", ["Q4_0"]),
        ("tiny-q8_0", ["Q8_0"]), ("tiny-bf16", ["BF16"]), ("tiny-f16", ["F16"]),
    ]
    for fx, types in fixtures:
        r = GGUFReader(os.path.join(FIXTURES, fx + ".gguf"))
        for tn in types:
            ts_ = [t for t in r.tensors if t.tensor_type.name == tn][:2]
            for ten in ts_:
                t = T[tn]
                row = int(ten.shape[0])
                rb = row // GGML_QUANT_SIZES[t][0] * GGML_QUANT_SIZES[t][1]
                raw = np.asarray(ten.data).view(np.uint8).reshape(-1)[: 2 * rb].tobytes()
                add(0, f"{fx}/{ten.name}", t, 2 * row, raw, dequant(t, raw))

    # activation quantizers
    for name, x in activation_rows(rng):
        add(1, f"act/{name}/Q8_0", T.Q8_0, x.size, q8_0_x86(x, False), x)
        add(1, f"act/{name}/Q8_1", T.Q8_1, x.size, q8_0_x86(x, True), x)
        add(1, f"act/{name}/Q8_K", T.Q8_K, x.size, q8_k_ref(x), x)
        add(1, f"act/{name}/F16", T.F16, x.size, f16_rne(x), x)
        add(1, f"act/{name}/BF16", T.BF16, x.size, bf16_rne(x), x)

    blob = b"PNQV" + struct.pack("<II", 1, len(recs)) + b"".join(recs)
    with open(OUT, "wb") as f:
        f.write(blob)
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(recs)} records, {len(blob)} bytes", file=sys.stderr)


if __name__ == "__main__":
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        main()
