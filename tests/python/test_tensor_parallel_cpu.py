#!/usr/bin/env python3
"""exactjit.tensor_parallel's plumbing on a machine without a GPU: ranks of a gloo group on the CPU.

The kernels need CUDA, so the runtime is replaced by a model of their contracts in torch, in plain
fp32 operations whose bits show any change of order or grouping: an output column is one chain over
k of its own weight row (whatever N); d_input's partial of a chunk of outputs (256 for bf16
weights, 64 for fp32) is one chain over the chunk's outputs, and the fold adds the chunks in
order, then (bf16 with SiLU) applies SiLU's derivative at temb; d_weight and d_bias are chains over
the rows T. Over that model, the column-sharded det_linear must give every rank the single-GPU
output, d_temb, and its shard's rows of d_weight and d_bias bit for bit, for 2 and 3 ranks, bf16
and fp32 weights, T = 1..3; and the naive split (each rank folds its own chunks, the results
all-reduced) must not, which shows the check can fail. The real kernels run in
tests/gpu/tensor_parallel_torch.py. Tests that need torch skip without it.
"""
import importlib.util
import unittest

from package_under_test import REPO  # noqa: F401  (puts the package on sys.path)

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_GLOO = False
if HAS_TORCH:
    import torch
    import torch.distributed as dist
    from gloo_ranks import problems_of_ranks, write_problems
    HAS_GLOO = dist.is_available() and dist.is_gloo_available()
    CHUNK = {torch.bfloat16: 256, torch.float32: 64}
    BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


def silu(v):
    return v / (1 + torch.exp(-v))


def silu_derivative(v):
    s = 1 / (1 + torch.exp(-v))
    return s * (1 + v * (1 - s))


class ModelRuntime:
    """The contracts of the det_linear kernels exactjit.tensor_parallel calls, on CPU tensors."""

    def det_linear_input_chunk(self, weight_dtype):
        return CHUNK[weight_dtype]

    @staticmethod
    def _input(x, weight, with_silu):
        """What the forward multiplies: bf16 weights, rT(silu(temb)) or rT(temb); fp32, x."""
        x = x.float()
        if weight.dtype != torch.bfloat16:
            return x
        return (silu(x) if with_silu else x).to(torch.bfloat16).float()

    def _det_linear(self, x, weight, bias, with_silu, with_pre):
        v, w = self._input(x, weight, with_silu), weight.float()
        acc = torch.zeros((x.shape[0], weight.shape[0]))
        for k in range(weight.shape[1]):
            acc = acc + v[:, k:k + 1] * w[:, k]
        if bias is not None:
            acc = acc + bias.float()
        if weight.dtype == torch.bfloat16:
            return acc.to(torch.bfloat16), None
        return silu(acc) if with_silu else acc, acc if with_pre else None

    @staticmethod
    def _output_grad(grad, weight, pre, with_silu):
        g = grad.float()
        return g * silu_derivative(pre) if weight.dtype == torch.float32 and with_silu else g

    def _parameter_grads(self, g, x, weight, with_silu, need_weight, need_bias):
        v = self._input(x, weight, with_silu)
        d_weight = d_bias = None
        if need_weight:
            acc = torch.zeros(weight.shape)
            for t in range(g.shape[0]):
                acc = acc + g[t][:, None] * v[t][None, :]
            d_weight = acc.to(weight.dtype)
        if need_bias:
            acc = torch.zeros(weight.shape[0])
            for t in range(g.shape[0]):
                acc = acc + g[t]
            d_bias = acc.to(weight.dtype)
        return d_weight, d_bias

    def det_linear_backward_partials(self, grad, x, weight, pre=None, *, silu=False, need_weight=True,
                                     need_bias=True):
        g = self._output_grad(grad, weight, pre, silu)
        (rows, n), k, chunk = g.shape, weight.shape[1], CHUNK[weight.dtype]
        chunks = -(-n // chunk)
        g_chunks = torch.zeros((rows, chunks * chunk))
        g_chunks[:, :n] = g
        w_chunks = torch.zeros((chunks * chunk, k))
        w_chunks[:n] = weight.float()
        g_chunks = g_chunks.view(rows, chunks, chunk).permute(1, 0, 2)
        w_chunks = w_chunks.view(chunks, chunk, k)
        partials = torch.zeros((chunks, rows, k))
        for i in range(chunk):
            partials = partials + g_chunks[:, :, i:i + 1] * w_chunks[:, i:i + 1, :]
        return (partials, *self._parameter_grads(g, x, weight, silu, need_weight, need_bias))

    def det_linear_input_fold(self, partials, x, *, weight_dtype, silu=False):
        d = torch.zeros(partials.shape[1:])
        for c in range(partials.shape[0]):
            d = d + partials[c]
        return d * silu_derivative(x.float()) if weight_dtype == torch.bfloat16 and silu else d

    def det_linear_backward(self, grad, x, weight, pre=None, *, silu=False, need_input=True, need_weight=True,
                            need_bias=True):
        partials, d_weight, d_bias = self.det_linear_backward_partials(grad, x, weight, pre, silu=silu,
                                                                       need_weight=need_weight, need_bias=need_bias)
        d_input = self.det_linear_input_fold(partials, x, weight_dtype=weight.dtype, silu=silu) if need_input else None
        return d_input, d_weight, d_bias


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def rank_main(rank, world, folder):
    """One rank: its problems, if any, go to folder/rank<r>.txt."""
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=world)
    from exactjit import tensor_parallel as xt
    model = ModelRuntime()
    xt.default_runtime = lambda: model
    problems = []
    in_features, out_features = 32, 3 * 256 * 2
    for dtype in (torch.bfloat16, torch.float32):
        for rows in (1, 2, 3):
            case = f"{dtype} T={rows}"
            torch.manual_seed(rows)
            temb = torch.randn(rows, in_features) * 3
            weight = (torch.randn(out_features, in_features) / 4).to(dtype)
            bias = torch.randn(out_features).to(dtype)
            grad = torch.randn(rows, out_features).to(dtype)
            out_ref, pre = model._det_linear(temb, weight, bias, True, dtype == torch.float32)
            d_ref, dw_ref, db_ref = model.det_linear_backward(grad, temb, weight, pre, silu=True)

            shards = xt.ColumnShards(out_features, weight_dtype=dtype)
            x_leaf = temb.clone().requires_grad_()
            w_leaf = shards.rows(weight).clone().requires_grad_()
            b_leaf = shards.rows(bias).clone().requires_grad_()
            out = xt.det_linear(x_leaf, w_leaf, b_leaf, silu=True)
            out.backward(grad)
            for name, got, want in (("out", out, out_ref), ("d_temb", x_leaf.grad, d_ref),
                                    ("d_weight shard", w_leaf.grad, shards.rows(dw_ref)),
                                    ("d_bias shard", b_leaf.grad, shards.rows(db_ref))):
                if not same_bits(got.detach(), want.contiguous()):
                    problems.append(f"{case}: {name} differs from the single-GPU model")

            w_only = shards.rows(weight).clone().requires_grad_()  # x needs no gradient: no partials, no fold
            xt.det_linear(temb, w_only, shards.rows(bias), silu=True).backward(grad)
            if not same_bits(w_only.grad, shards.rows(dw_ref).contiguous()):
                problems.append(f"{case}: d_weight shard without d_temb differs from the single-GPU model")

            # The naive split: each rank folds its own chunks (SiLU's derivative included), all-reduced.
            own = model.det_linear_backward_partials(shards.columns(grad), temb, shards.rows(weight),
                                                     None if pre is None else shards.columns(pre), silu=True)[0]
            naive = model.det_linear_input_fold(own, temb, weight_dtype=dtype, silu=True)
            dist.all_reduce(naive)
            if same_bits(naive, d_ref):
                problems.append(f"{case}: the naive split gave the single-GPU bits: the check cannot fail")
    try:
        xt.ColumnShards(256 * world + 256)
        problems.append("ColumnShards took a shard that is not whole chunks")
    except Exception as e:  # noqa: BLE001 - the type is checked below
        if type(e).__name__ != "InvalidArgumentError" or "multiple of" not in str(e):
            problems.append(f"ColumnShards refused a bad N with {type(e).__name__}: {e}")
    write_problems(folder, rank, problems)
    dist.destroy_process_group()


@unittest.skipUnless(HAS_TORCH, "needs torch")
class RuntimeEntryPoints(unittest.TestCase):
    """The Runtime methods over the C entry points, as far as a machine without a GPU reaches."""

    def test_the_chunk_comes_from_the_library(self):
        import exactjit
        self.assertEqual(exactjit.Runtime.det_linear_input_chunk(torch.bfloat16), 256)
        self.assertEqual(exactjit.Runtime.det_linear_input_chunk(torch.float32), 64)
        with self.assertRaisesRegex(exactjit.InvalidArgumentError, "weight_dtype must be torch.bfloat16 or"):
            exactjit.Runtime.det_linear_input_chunk(torch.float16)

    def test_the_library_refuses_by_entry_point_and_argument(self):
        import exactjit
        rt = exactjit.runtime()
        with self.assertRaisesRegex(exactjit.InvalidArgumentError, "^det_linear_input_fold: partials must be a CUDA"):
            rt.det_linear_input_fold(torch.zeros(2, 1, 16), torch.zeros(1, 16), weight_dtype=torch.bfloat16, silu=True)
        with self.assertRaisesRegex(exactjit.InvalidArgumentError,
                                    "^det_linear_backward_partials: grad must be a CUDA"):
            rt.det_linear_backward_partials(torch.zeros(1, 256, dtype=torch.bfloat16), torch.zeros(1, 16),
                                            torch.zeros(256, 16, dtype=torch.bfloat16))


@unittest.skipUnless(HAS_GLOO, "needs torch with gloo")
class TensorParallelOnCpuRanks(unittest.TestCase):
    def test_every_rank_gets_the_single_gpu_bits(self):
        for world in (2, 3):
            with self.subTest(ranks=world):
                self.assertEqual(problems_of_ranks(rank_main, world), {})


if __name__ == "__main__":
    unittest.main()
