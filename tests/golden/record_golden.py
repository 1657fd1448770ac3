#!/usr/bin/env python3
"""Records the golden vectors that pin exactjit's shared device numerics to PyTorch.

Run on the GPU machine (PyTorch with CUDA). Every output is computed by PyTorch eager on the GPU;
the host build of templates/numerics.cuh must reproduce each one bit for bit
(tests/cpu/numerics_golden_test.cpp). Files written to the output folder:

  <case>.in.bin   the inputs, little-endian, as described in golden.json
  <case>.out.bin  PyTorch's outputs
  golden.json     cases, element types, counts, torch version, device

Inputs are built from a fixed seed plus hand-picked special values (signed zeros, infinities,
NaN payloads, denormals, rounding ties and near-ties, overflow edges).
"""
import argparse
import json
import math
import os
import struct

import torch


def special_f32_bits():
    bits = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFF812345, 0x7FFFFFFF,  # NaNs
        0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00008000, 0x00018000,  # denormals
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x477FEFFF, 0x477FF000,  # near max
        0x477FE000, 0x47800000, 0x38800000, 0x33800000, 0x33000000, 0x33000001,  # fp16 edges
        0x387FC000, 0x387FE000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties
        0x3F800000, 0xBF800000, 0x3F801000, 0x3F800800, 0x3F801800, 0x3F802000,
    ]
    # Every tie and near-tie pattern of the low 16 bits (bf16) and low 13 bits (fp16).
    for hi in (0x3F80, 0x0001, 0x4712, 0xC0A0, 0x0080):
        for lo in (0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x0000, 0x18000 & 0xFFFF):
            bits.append((hi << 16) | lo)
    for e in range(0x66, 0x90):  # fp16 subnormal/normal range with tie patterns
        for m in (0x000FFF, 0x001000, 0x001001, 0x003000, 0x7FF000, 0x7FEFFF):
            bits.append((e << 23) | m)
            bits.append(0x80000000 | (e << 23) | m)
    return bits


def u32_tensor(values):
    return torch.tensor([v - (1 << 32) if v >= (1 << 31) else v for v in values], dtype=torch.int32)


def random_f32_bits(gen, n):
    # Random bit patterns (every exponent) plus values of ordinary magnitude.
    raw = torch.randint(-(1 << 31), (1 << 31) - 1, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    normal = (torch.randn(n, generator=gen, dtype=torch.float32) * 8).view(torch.int32)
    return torch.cat([raw, normal])


def save(out_dir, name, inputs, outputs, meta, cases):
    with open(os.path.join(out_dir, name + ".in.bin"), "wb") as f:
        f.write(inputs.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    with open(os.path.join(out_dir, name + ".out.bin"), "wb") as f:
        f.write(outputs.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    meta = dict(meta)
    meta["name"] = name
    cases.append(meta)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(20261202)
    cases = []

    f32_in = torch.cat([u32_tensor(special_f32_bits()), random_f32_bits(gen, 4096)])
    n = f32_in.numel()
    f32_vals = f32_in.view(torch.float32).to(dev)
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        out = f32_vals.to(dtype).view(torch.int16)
        save(args.out, f"f32_to_{name}", f32_in, out,
             {"in": "u32", "out": "u16", "count": n, "op": f"float32 -> {name} (Tensor.to)"}, cases)
        every = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
        back = every.to(dev).view(dtype).float().view(torch.int32)
        save(args.out, f"{name}_to_f32", every, back,
             {"in": "u16", "out": "u32", "count": 1 << 16, "op": f"{name} -> float32 (Tensor.float)"}, cases)

    # gate_residual elementwise: out = residual + gate * y, each op rounded to the dtype by eager.
    m = 8192
    for dtype, name, width in ((torch.bfloat16, "bf16", 2), (torch.float16, "fp16", 2), (torch.float32, "fp32", 4)):
        cols = []
        for scale in (1.0, 1e-3, 30.0):
            cols.append((torch.randn(3, m // 4, generator=gen) * scale))
        rnd = torch.cat(cols, dim=1)
        specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-42, 65504.0,
                                 3.0e38, 1e-8])
        grid = torch.cartesian_prod(specials, specials, specials).t()
        trip = torch.cat([rnd, grid], dim=1).to(dtype)
        residual, gate, y = (trip[k].to(dev) for k in range(3))
        out = residual + gate * y
        itype = torch.int16 if width == 2 else torch.int32
        save(args.out, f"gate_residual_{name}", trip.view(itype), out.view(itype),
             {"in": "u16" if width == 2 else "u32", "out": "u16" if width == 2 else "u32",
              "count": trip.shape[1], "layout": "in = residual[count] gate[count] y[count]",
              "op": f"residual + gate * y in {name} (eager)"}, cases)

    # rms_norm (PyTorch's fused RMSNorm via F.rms_norm) with and without weight, and the AdaLN
    # modulation on top: n * (1 + scale) + shift with gathered rows. Rows of ordinary, tiny
    # (eps matters) and large magnitude, and a row with NaN and one with Inf.
    eps = 1e-5
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32")):
        itype = torch.int16 if dtype != torch.float32 else torch.int32
        for h in (12, 256, 4096, 5376):
            rows = 8
            x = torch.randn(rows, h, generator=gen)
            x[1] *= 1e-3
            x[2] *= 1e-6
            x[3] *= 30
            x[4, h // 3] = float("nan")
            x[5, h // 2] = float("inf")
            x = x.to(dtype)
            weight = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype)
            scale = (0.2 * torch.randn(rows, h, generator=gen)).to(dtype)
            shift = (0.5 * torch.randn(rows, h, generator=gen)).to(dtype)
            xd, wd, sc, sh = x.to(dev), weight.to(dev), scale.to(dev), shift.to(dev)
            plain = torch.nn.functional.rms_norm(xd, (h,), wd, eps)
            unweighted = torch.nn.functional.rms_norm(xd, (h,), None, eps)
            modulated = unweighted * (1 + sc) + sh
            packed_in = torch.cat([x.reshape(-1), weight, scale.reshape(-1), shift.reshape(-1)]).view(itype)
            packed_out = torch.cat([plain.reshape(-1), unweighted.reshape(-1), modulated.reshape(-1)]).view(itype)
            save(args.out, f"rms_norm_{name}_h{h}", packed_in, packed_out,
                 {"in": "u16" if dtype != torch.float32 else "u32", "out": "u16" if dtype != torch.float32 else "u32",
                  "count": rows * h, "rows": rows, "hidden": h, "eps": eps,
                  "layout": "in = x[rows*H] weight[H] scale[rows*H] shift[rows*H]; "
                            "out = rms_norm(x, w)[rows*H] rms_norm(x)[rows*H] rms_norm(x)*(1+scale)+shift[rows*H]",
                  "op": f"F.rms_norm in {name} (eager), plain, unweighted and AdaLN-modulated"}, cases)

    # timestep_sinusoid: diffusers get_timestep_embedding, written out as diffusers does it.
    t = torch.cat([torch.tensor([0.0, 1.0, 0.5, 1e-4, 0.999]), torch.rand(59, generator=gen)])
    td = t.to(dev)
    half = 128
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=dev)
    exponent = exponent / (half - 0)
    emb = td[:, None].float() * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)  # flip_sin_to_cos
    save(args.out, "timestep_sinusoid_c256", t.view(torch.int32), emb.view(torch.int32),
         {"in": "u32", "out": "u32", "count": t.numel(), "channels": 256,
          "op": "diffusers get_timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0)"}, cases)

    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cuda": torch.version.cuda,
                   "device": torch.cuda.get_device_name(), "seed": 20261202, "cases": cases}, f, indent=1)
    print("recorded", len(cases), "cases into", args.out)


if __name__ == "__main__":
    main()
