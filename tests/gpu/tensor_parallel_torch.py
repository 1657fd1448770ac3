#!/usr/bin/env python3
"""exactjit.tensor_parallel against one GPU, byte for byte (issue 18 item 2), on the GPU machine.

For each world size in --ranks, that many processes form a torch.distributed group (--backend,
default gloo: NCCL refuses two ranks on one device, so on a one-GPU machine every rank shares
cuda:0; with more GPUs rank r takes cuda:r % count). Every rank draws the same inputs for each
layer and T in --rows: temb (T, K) float32, the weight (N, K), the bias (N,) and the upstream
gradient of the whole output (T, N) (bf16 for bf16 weights: the gathered table's gradient; fp32
for fp32). The single-GPU reference is exactjit.det_linear's own autograd over the whole layer on
the rank's device; the sharded run gives rank r the weight and bias rows [r N / P, (r + 1) N / P)
(exactjit.tensor_parallel.det_linear under autograd).

Layers (--layers, default all):
  block   the H3 block AdaLN projection, bf16, SiLU on temb: K = 2688 (time embedding), N = 18H = 96768
  final   the H3 final AdaLN projection, bf16, SiLU: K = 2688, N = 2H = 10752
  issue   issue 18's sizes, bf16, SiLU: K = H = 5376, N = 6H = 32256
  small   a non-H3 shape, bf16, SiLU: K = 640, N = 4608
  mlp1    the timestep MLP's first layer, fp32 weights, SiLU on the output: K = 256, N = 5376
  mlp2    the timestep MLP's second layer, fp32 weights: K = 5376, N = 2688
Checks per layer, T and rank: out (the gathered (T, N) output), d_temb (whole, every rank),
d_weight and d_bias (the rank's rows), each bitwise against the single-GPU autograd; and, once per
layer, the control: the naive split (each rank's own single-GPU d_input of its shard, SiLU's
derivative included, summed over ranks) must NOT give the single-GPU d_temb, which shows the
comparison fails where the fold order is not kept.

Usage: python3 tests/gpu/tensor_parallel_torch.py [--ranks 2,3] [--rows 1,2,3] [--layers block,final,...]
    [--backend gloo] [--report tp.md] [--json tp.json]
Exit status: 0 every check passes, 1 a check failed, 2 exactjit, CUDA or torch.distributed unavailable.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "python"))
sys.path.insert(0, HERE)
from check_support import compare  # noqa: E402
from rank_runs import join, leave, naive_split_differs, report, run_worlds  # noqa: E402

# name -> (description, weight dtype, K, N, silu); every N a multiple of 2 and 3 ranks x the chunk.
LAYERS = {
    "block": ("H3 block AdaLN projection (bf16, 2688 -> 18H)", torch.bfloat16, 2688, 96768, True),
    "final": ("H3 final AdaLN projection (bf16, 2688 -> 2H)", torch.bfloat16, 2688, 10752, True),
    "issue": ("issue 18's sizes (bf16, H -> 6H)", torch.bfloat16, 5376, 32256, True),
    "small": ("non-H3 shape (bf16, 640 -> 4608)", torch.bfloat16, 640, 4608, True),
    "mlp1": ("timestep MLP layer 1 (fp32, 256 -> 5376, SiLU on the output)", torch.float32, 256, 5376, True),
    "mlp2": ("timestep MLP layer 2 (fp32, 5376 -> 2688)", torch.float32, 5376, 2688, False),
}


def draw(shape, dtype, device, seed, scale=1.0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def layer_case(xj, xt, layer, rows, device, seed):
    """[(quantity, ok, detail)] for one layer and T, and what the control needs."""
    _, dtype, in_features, out_features, silu = LAYERS[layer]
    temb = draw((rows, in_features), torch.float32, device, seed, 3.0)
    weight = draw((out_features, in_features), dtype, device, seed + 1, in_features ** -0.5)
    bias = draw((out_features,), dtype, device, seed + 2)
    grad = draw((rows, out_features), dtype, device, seed + 3)

    x_ref, w_ref, b_ref = (t.clone().requires_grad_() for t in (temb, weight, bias))
    out_ref = xj.det_linear(x_ref, w_ref, b_ref, silu=silu)
    out_ref.backward(grad)

    shards = xt.ColumnShards(out_features, weight_dtype=dtype)
    x_tp = temb.clone().requires_grad_()
    w_tp, b_tp = (shards.rows(t).clone().requires_grad_() for t in (weight, bias))
    out = xt.det_linear(x_tp, w_tp, b_tp, silu=silu)
    out.backward(grad)
    torch.cuda.synchronize()
    checks = [("out (gathered)", *compare(out.detach(), out_ref.detach())),
              ("d_temb", *compare(x_tp.grad, x_ref.grad)),
              ("d_weight (shard rows)", *compare(w_tp.grad, shards.rows(w_ref.grad).contiguous())),
              ("d_bias (shard rows)", *compare(b_tp.grad, shards.rows(b_ref.grad).contiguous()))]
    return checks, (temb, weight, grad, x_ref.grad, shards, silu)


def naive_control(xj, inputs):
    """Each rank's single-GPU d_input of its own shard (the fold and SiLU's derivative over its
    chunks only), summed over ranks: must differ from the single-GPU d_temb."""
    temb, weight, grad, ref, shards, silu = inputs
    rows_weight = shards.rows(weight).contiguous()
    pre = None
    if weight.dtype == torch.float32 and silu:
        pre = xj.runtime().det_linear(temb, rows_weight, None, silu=True, return_pre_activation=True)[1]
    own = xj.runtime().det_linear_backward(shards.columns(grad), temb, rows_weight, pre, silu=silu,
                                           need_weight=False, need_bias=False)[0]
    return [naive_split_differs("naive per-rank d_input differs (control)", own, ref, shards.group, "d_temb")]


def worker(rank, world, args, init_file, result_file):
    device = join(rank, world, args.backend, init_file)
    import exactjit as xj
    from exactjit import tensor_parallel as xt
    results = []
    for n, layer in enumerate(args.layers.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            case = f"{world} ranks, {LAYERS[layer][0]}, T = {rows}"
            start = time.perf_counter()
            checks, inputs = layer_case(xj, xt, layer, rows, device, seed=100 * n + 10 * rows)
            if rows == max(int(r) for r in args.rows.split(",")):
                checks += naive_control(xj, inputs)
            results += [dict(case=case, quantity=q, ok=ok, detail=d) for q, ok, d in checks]
            del checks, inputs
            torch.cuda.empty_cache()
            print(f"rank {rank}: {case}: {time.perf_counter() - start:.2f} s", flush=True)
    leave(world, results, result_file)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,3", help="world sizes to run, comma-separated")
    parser.add_argument("--rows", default="1,2,3", help="T values (1..8), comma-separated")
    parser.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of {', '.join(LAYERS)}")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--report")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    unknown = [name for name in args.layers.split(",") if name not in LAYERS]
    if unknown:
        parser.error(f"unknown layers {unknown}; choose from {', '.join(LAYERS)}")
    for world in (int(w) for w in args.ranks.split(",")):
        for name in args.layers.split(","):
            _, dtype, _, out_features, _ = LAYERS[name]
            chunk = 256 if dtype == torch.bfloat16 else 64
            if out_features % (world * chunk):
                parser.error(f"{name}: N = {out_features} does not split into {world} shards "
                             f"of whole {chunk}-output chunks")
    if any(not 1 <= int(r) <= 8 for r in args.rows.split(",")):
        parser.error("--rows: T must be in 1..8 (the backward's limit)")
    return args


def main():
    args = parse_args()
    if not torch.cuda.is_available() or not dist.is_available():
        print("tensor_parallel_torch: needs CUDA and torch.distributed", file=sys.stderr)
        return 2
    meta = dict(device=torch.cuda.get_device_name(), devices=torch.cuda.device_count(), backend=args.backend,
                torch=torch.__version__, commit=os.environ.get("EXACTJIT_COMMIT", "unknown"), rows=args.rows,
                layers=args.layers)
    rows = run_worlds(worker, [int(w) for w in args.ranks.split(",")], args)
    return report("tensor_parallel_torch", "exactjit.tensor_parallel: column-sharded det_linear against one GPU",
                  "Every rank checks the gathered output, the whole d_temb it ends with and its shard's rows of "
                  "d_weight and d_bias.", ("case", "quantity"), rows, meta, args)


if __name__ == "__main__":
    sys.exit(main())
