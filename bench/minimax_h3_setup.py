"""diffusers' MiniMax-H3 transformer and its packed inputs, as tests/gpu/diffusers_torch.py,
bench/bench_e2e.py and tests/python/test_integration_cpu.py build them.

The model is the shipped width (defaults: H 5376, 56 heads x 128, ffn 14336, freq_dim 256) at a small
depth (DEPTH), laid out like the shipped checkpoint: bf16 except the _keep_in_fp32_modules. The
packed sequence interleaves text, audio and video rows at scattered positions with T = 3 distinct
timesteps, so every AdaLN table row and both index tensors are exercised.
"""
import torch

DEPTH = dict(num_layers=2, num_refiner_layers=1)
TIMESTEPS = 3
# A width small enough for CPU tests, with three different epsilons so a norm given another's
# eps changes the output.
TINY = dict(num_attention_heads=2, attention_head_dim=32, hidden_size=64, ffn_dim=128, in_channels=4,
            audio_in_channels=8, text_dim=40, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=48,
            rope_freq_dim=4, norm_eps=1e-5, qk_norm_eps=1e-6, final_norm_eps=1e-4)


def cast_like_checkpoint(model, dtype):
    """Every parameter and floating buffer to `dtype`, except those of the _keep_in_fp32_modules,
    matched against the components of the name as diffusers' from_pretrained matches them, which
    stay float32 (never round-tripped through `dtype`)."""
    keep = set(model._keep_in_fp32_modules or ())
    for name, module in model.named_modules():
        target = torch.float32 if keep.intersection(name.split(".")) else dtype
        for param in module.parameters(recurse=False):
            param.data = param.data.to(target)
        for key, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point():
                setattr(module, key, buffer.to(target))


def build_model(dtype=torch.bfloat16, device="cuda", seed=0, **config):
    """MiniMaxH3Transformer3DModel(**DEPTH, **config) on `device`, in eval mode, cast with
    cast_like_checkpoint. RMSNorm weights are 1 + 0.1 randn (the default ones would hide a norm
    given another's weight); the rest is diffusers' default init (nn.Linear's uniform: non-zero
    AdaLN projections)."""
    from diffusers import MiniMaxH3Transformer3DModel
    torch.manual_seed(seed)
    with torch.device(device):
        model = MiniMaxH3Transformer3DModel(**{**DEPTH, **config})
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm) and module.weight is not None:
                module.weight.copy_(1 + 0.1 * torch.randn_like(module.weight))
    cast_like_checkpoint(model, dtype)
    return model.eval()


def packed_inputs(model, seq_len, text=257, audio=320, batch=1, seed=0):
    """forward() keyword arguments for one packed sequence of seq_len rows on the model's device:
    `text` text rows, `audio` audio rows, the rest video; each modality at sorted random positions,
    so the three interleave. T = 3 random timesteps in [0, 1): video rows use 0 (first quarter, the
    conditioning frames) and 1, audio 2, text 0. position_ids: video rows walk a (t, 16, 32) grid,
    text and audio rows count along t. Latents are float32 randn (forward casts them)."""
    cfg = model.config
    device = model.proj_in.weight.device
    video = seq_len - text - audio
    if video < 1:
        raise ValueError(f"seq_len {seq_len} leaves no video rows after {text} text and {audio} audio rows")
    gen = torch.Generator(device).manual_seed(seed)
    order = torch.randperm(seq_len, generator=gen, device=device)
    text_indices = order[:text].sort().values
    audio_indices = order[text:text + audio].sort().values
    video_indices = order[text + audio:].sort().values

    token_tags = torch.zeros(seq_len, dtype=torch.long, device=device)
    token_tags[text_indices] = 1
    token_tags[audio_indices] = 2
    video_steps = torch.ones(video, dtype=torch.long, device=device)
    video_steps[:video // 4] = 0
    timestep_indices = torch.zeros(seq_len, dtype=torch.long, device=device)
    timestep_indices[video_indices] = video_steps
    timestep_indices[audio_indices] = 2

    k = torch.arange(video, device=device)
    position_ids = torch.zeros(seq_len, 3, dtype=torch.long, device=device)
    position_ids[video_indices] = torch.stack((k // 512, (k // 32) % 16, k % 32), dim=1)
    position_ids[text_indices, 0] = torch.arange(text, device=device)
    position_ids[audio_indices, 0] = torch.arange(audio, device=device)

    patch = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device)

    return dict(hidden_states=randn(batch, video, patch),
                audio_hidden_states=randn(batch, audio, cfg.audio_in_channels),
                encoder_hidden_states=randn(batch, text, cfg.text_dim),
                timestep=torch.rand(TIMESTEPS, generator=gen, device=device), timestep_indices=timestep_indices,
                token_tags=token_tags, position_ids=position_ids, video_indices=video_indices,
                audio_indices=audio_indices, text_indices=text_indices, return_dict=False)


def upstream(outputs, seed=1):
    """A fixed random gradient for each output (the (video, audio) tuple of forward)."""
    gen = torch.Generator(outputs[0].device).manual_seed(seed)
    return tuple(torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype) for o in outputs)


def expected_calls(model, qk_norm=False, refiner_norms=False, det_linear=False, sequence_parallel=False):
    """How many times one forward of a patched MiniMaxH3Transformer3DModel calls each exactjit op
    (exactjit.integrations.diffusers.apply with these options) when every call takes the kernels;
    sequence_parallel changes no count (outside context parallelism it changes nothing)."""
    layers, refiners = model.config.num_layers, model.config.num_refiner_layers
    return dict(rms_norm=layers + 1 + (2 * (layers + refiners) if qk_norm else 0)
                + (2 * refiners + 1 if refiner_norms else 0),
                gate_residual=layers, gate_residual_rms_norm=layers, timestep_sinusoid=1,
                timestep_mlp=int(det_linear), adaln_projection=(layers + 1) if det_linear else 0)
