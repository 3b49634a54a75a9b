"""rhymerl's native Llama-family decoder (RMSNorm, RoPE, SwiGLU) with two forward paths.

One decoder holds the embedded model and the Llama, Qwen2 and Mistral-style models of the hub: their
differences are options of the config (grouped-query attention, projection biases, an untied output
layer, Llama 3's RoPE scaling), so the torch engine's bit-exact decoding and every draft source run
on a real pretrained model as they do on the embedded one.

`forward` scores whole right-padded sequences (training, log-probs). `forward_cached` appends a
ragged block of tokens per KV-cache slot and returns their logits: prefill (on the native kernel;
elsewhere torch's attention over the whole rows), one-token decode and multi-token draft
verification are the same call, so a token gets the same bits in each (cached_attention.py), and
rolling back a rejected draft is only a matter of the caller's slot lengths (entries past a slot's
length are never attended to).

Parameter names follow Hugging Face's LlamaForCausalLM so a checkpoint maps onto it one to one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from rhymerl.workers.model import cached_attention
from rhymerl.workers.model.folder import ModelConfig, ModelError, check_native, read_config
from rhymerl.workers.model.policy import PolicyModel, at_positions, read_weights
from rhymerl.workers.model.row_invariant import padded_rows, silu_rows


class KVCache:
    """Per-slot keys and values of every layer.

    Values are [layers, slots, kv_heads, max_len, head_dim] (grouped-query attention caches one head per
    group of query heads). Keys are the same, except where the
    native kernel runs attention (`native`: CPU, float32): there they are stored transposed,
    [layers, slots, kv_heads, head_dim, max_len], and max_len is rounded up to the kernel's 16 lanes.
    `keys(layer, slots, span)` gives the [slots, kv_heads, span, head_dim] view either way.
    """

    def __init__(self, cfg: ModelConfig, slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        self.native = cached_attention.usable(device, dtype, cfg.head_dim)
        if self.native:
            max_len = -(-max_len // cached_attention.LANES) * cached_attention.LANES
        shape = (cfg.num_hidden_layers, slots, cfg.kv_heads, max_len, cfg.head_dim)
        key_shape = (*shape[:3], shape[4], shape[3]) if self.native else shape
        self.k = torch.zeros(key_shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.slots = slots

    def keys(self, layer: int, slots: int, span: int) -> Tensor:
        """Keys of positions 0..span-1, [slots, heads, span, head_dim]."""
        if self.native:
            return self.k[layer, :slots, :, :, :span].transpose(-1, -2)
        return self.k[layer, :slots, :, :span]

    def write_prefix(self, layer: int, slots: Tensor, ks: Tensor, vs: Tensor, rows: Tensor | None = None) -> None:
        """Keys and values [n, heads, L, head_dim] of positions 0..L-1 into `slots`; with `rows`,
        slot i takes row rows[i] (several slots may share one row)."""
        if rows is not None:
            ks, vs = ks[rows], vs[rows]
        length = ks.shape[2]
        if self.native:
            self.k[layer, slots, :, :, :length] = ks.transpose(-1, -2)
        else:
            self.k[layer, slots, :, :length] = ks
        self.v[layer, slots, :, :length] = vs

    def write_cells(self, layer: int, cells: Cells, ks: Tensor, vs: Tensor) -> None:
        """Keys and values [T, heads, head_dim] of a block's real cells at their positions (for torch's
        attention; the native kernel stores them itself)."""
        slot, head, pos = cells.write
        if self.native:
            self.k[layer, slot, head, :, pos] = ks
        else:
            self.k[layer, slot, head, pos] = ks
        self.v[layer, slot, head, pos] = vs

    def move(self, src: Tensor, dst: Tensor, length: int | None = None) -> None:
        """Copy slots src[i] -> dst[i] (all layers), e.g. to pack running sequences to the front;
        with `length`, only positions 0..length-1 (nothing past a slot's length is ever read)."""
        n = self.max_len if length is None else min(length, self.max_len)
        if self.native:
            self.k[:, dst, :, :, :n] = self.k[:, src, :, :, :n]
        else:
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]


class Cells:
    """Where the real tokens of a ragged block [S, W] sit: row-major cells, their cache positions.

    `pad` scatters per-cell values back into the [S, W, ...] block (zeros elsewhere), `unpad`
    gathers them out; both are views when every cell is real. `start` and `counts` are each slot's
    first position and number of real cells. `bias` is the additive attention mask [S, 1, W, span]
    for torch's attention, built on first use and shared by all layers: a cell sees its slot's keys
    up to its own position (the native kernel needs no mask).
    """

    def __init__(self, rows: Tensor | None, cols: Tensor | None, positions: Tensor, grid: Tensor,
                 start: Tensor, counts: Tensor, write: tuple[Tensor, Tensor, Tensor], dtype: torch.dtype) -> None:
        self.rows, self.cols, self.positions, self.grid = rows, cols, positions, grid
        self.shape = (grid.shape[0], grid.shape[1])
        self.start, self.counts, self.write, self.dtype = start, counts, write, dtype

    @classmethod
    def build(cls, start: Tensor, width: int, max_len: int, counts: Tensor | None, heads: int,
              dtype: torch.dtype) -> Cells:
        slots, device = start.shape[0], start.device
        offsets = torch.arange(width, device=device)
        grid = (start[:, None] + offsets[None, :]).clamp_(max=max_len - 1)  # [S, W]
        rows = cols = None
        if counts is not None and not bool((counts >= width).all()):
            rows, cols = (offsets[None, :] < counts[:, None]).nonzero(as_tuple=True)
            positions = grid[rows, cols]
            slot_of = rows
        else:
            positions = grid.reshape(-1)
            slot_of = torch.arange(slots, device=device).repeat_interleave(width)
            counts = torch.full((slots,), width, dtype=torch.int64, device=device)
        write = (slot_of[:, None], torch.arange(heads, device=device)[None, :], positions[:, None])
        return cls(rows, cols, positions, grid, start, counts, write, dtype)

    @functools.cached_property
    def span(self) -> int:
        """Cache positions the block's attention reads: up to the furthest cell."""
        return int(self.positions.max().item()) + 1 if self.positions.numel() else 1

    @functools.cached_property
    def bias(self) -> Tensor:
        keys = torch.arange(self.span, device=self.grid.device)
        bias = torch.zeros(*self.shape[:1], 1, self.shape[1], self.span, device=self.grid.device, dtype=self.dtype)
        return bias.masked_fill_(keys[None, None, None, :] > self.grid[:, None, :, None], float("-inf"))

    def pad(self, values: Tensor) -> Tensor:
        if self.rows is None:
            return values.view(*self.shape, *values.shape[1:])
        out = values.new_zeros(*self.shape, *values.shape[1:])
        out[self.rows, self.cols] = values
        return out

    def unpad(self, block: Tensor) -> Tensor:
        if self.rows is None:
            return block.reshape(-1, *block.shape[2:])
        return block[self.rows, self.cols]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, self.h, self.kv, self.hd = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.head_dim
        self.group = self.h // self.kv  # query heads per key/value head
        self.q_proj = nn.Linear(d, self.h * self.hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, self.kv * self.hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, self.kv * self.hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=cfg.o_bias)

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, q, _ = x.shape
        qs = _rotate(self.q_proj(x).view(b, q, self.h, self.hd).transpose(1, 2), cos, sin)
        ks = _rotate(self.k_proj(x).view(b, q, self.kv, self.hd).transpose(1, 2), cos, sin)
        vs = self.v_proj(x).view(b, q, self.kv, self.hd).transpose(1, 2)
        return qs, ks, vs

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                store: tuple[KVCache, int, Tensor, Tensor | None] | None = None) -> Tensor:
        """Causal self-attention over x alone; `store` = (cache, layer, slots, rows) keeps its
        keys/values (KVCache.write_prefix)."""
        qs, ks, vs = self._qkv(x, cos, sin)
        if store is not None:
            cache, layer, slots, rows = store
            cache.write_prefix(layer, slots, ks, vs, rows)
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=self.group > 1)
        result: Tensor = self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))
        return result

    def forward_cached(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, layer: int,
                       cells: Cells) -> Tensor:
        """Attention of the block's real cells x [T, d] over their slots' cached keys; returns [T, d]."""
        t, slots = x.shape[0], cells.shape[0]
        qs = _rotate(padded_rows(self.q_proj, x).view(t, self.h, self.hd), cos, sin)
        ks = _rotate(padded_rows(self.k_proj, x).view(t, self.kv, self.hd), cos, sin)
        vs = padded_rows(self.v_proj, x).view(t, self.kv, self.hd)
        if cache.native:  # every pass, one token or many: a token's bits never depend on its pass (module docstring)
            out = cached_attention.attend(qs, ks, vs, cache.k[layer, :slots], cache.v[layer, :slots], cells.start,
                                          cells.counts)
            return padded_rows(self.o_proj, out.reshape(t, -1))
        cache.write_cells(layer, cells, ks, vs)
        queries = cells.pad(qs).transpose(1, 2)  # [S, heads, W, head_dim]
        span = cells.span
        keys, values = cache.keys(layer, slots, span), cache.v[layer, :slots, :, :span]
        if queries.shape[2] == 1:
            # one query per slot (plain decoding): torch's matmuls read the cache faster than the
            # native kernel or the fused SDPA kernel on CPU; a group's query heads share one read of
            # their key/value head
            grouped = queries.reshape(slots, self.kv, self.group, self.hd)
            scores = (grouped * self.hd**-0.5) @ keys.transpose(-1, -2) + cells.bias
            out = (torch.softmax(scores, dim=-1) @ values).reshape(queries.shape)
        else:
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=cells.bias,
                                                 enable_gqa=self.group > 1)
        return padded_rows(self.o_proj, cells.unpad(out.transpose(1, 2)).reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        result: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return result

    def forward_rows(self, x: Tensor) -> Tensor:
        """`forward` of x [T, hidden] whose rows' bits do not depend on T (the engine's passes)."""
        result: Tensor = self.down_proj(silu_rows(self.gate_proj(x)) * self.up_proj(x))
        return result


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """The block on whole sequences (training's path: a module call, which FSDP2 hooks to gather
        the block's weights)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        result: Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return result


class TinyLlama(PolicyModel):
    rope_cos: Tensor
    rope_sin: Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.blocks: list[Block] = list(self.layers)  # type: ignore[arg-type]  # typed view of the same modules
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        angles = torch.outer(torch.arange(cfg.max_position_embeddings, dtype=torch.float64), rope_frequencies(cfg))
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)
        self.apply(self._init)
        self.checkpointing = False

    def checkpoint_activations(self, on: bool) -> None:
        self.checkpointing = on

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def hf_state_dict(self) -> dict[str, Tensor]:
        named = {name if name.startswith("lm_head.") else f"model.{name}": t for name, t in self.state_dict().items()}
        if self.lm_head is None:
            named["lm_head.weight"] = named["model.embed_tokens.weight"]
        return named

    def load_hf_state_dict(self, tensors: Mapping[str, Tensor]) -> None:
        dtype = self.embed_tokens.weight.dtype
        self.load_state_dict({k.removeprefix("model."): v.to(dtype) for k, v in tensors.items()
                              if self.lm_head is not None or k != "lm_head.weight"})

    def config_json(self) -> str:
        return self.cfg.to_json()

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin for positions [L] or [B, L], shaped to broadcast over [B, heads, L, head_dim/2]."""
        if positions.dim() == 1:
            positions = positions[None]
        cos = self.rope_cos[positions].to(dtype).unsqueeze(1)
        sin = self.rope_sin[positions].to(dtype).unsqueeze(1)
        return cos, sin

    def _logits(self, x: Tensor) -> Tensor:
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(self.norm(x), head.weight)

    def forward(self, tokens: Tensor, at: Tensor | None = None) -> Tensor:
        """Logits for right-padded sequences [B, L] -> [B, L, V]; with `at` [B, T], only at those
        positions -> [B, T, V] (the output layer is applied to them alone)."""
        x = self.embed_tokens(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        cos, sin = self._rope(positions, x.dtype)
        recompute = self.checkpointing and torch.is_grad_enabled()
        for layer in self.blocks:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if recompute else layer(x, cos, sin)
        return self._logits(x if at is None else at_positions(x, at))

    def prefill(self, tokens: Tensor, lengths: Tensor, slots: Tensor, cache: KVCache,
                rows: Tensor | None = None) -> Tensor:
        """Score right-padded sequences tokens [n, L] (row i's first lengths[i] tokens) from position 0
        into cache `slots`, and return the logits of each row's last token [n, V]; with `rows`, slot
        i gets sequence rows[i], so a prompt shared by several slots is scored once.

        Where the cache runs the native kernel, the rows go through `forward_cached` as one ragged
        block: a sequence's bits are then those its tokens would get decoded one by one, whatever
        rows it is scored beside (a resumed or moved sample continues exactly)."""
        rows = torch.arange(tokens.shape[0], device=tokens.device) if rows is None else rows
        if not cache.native:
            return self._prefill_whole(tokens, slots, cache, rows)[torch.arange(tokens.shape[0]), lengths - 1]
        first = torch.full((tokens.shape[0],), -1, dtype=torch.int64)
        for slot, row in zip(slots.tolist(), rows.tolist(), strict=True):
            first[row] = slot if first[row] < 0 else first[row]
        block = torch.zeros(int(first.max()) + 1, tokens.shape[1], dtype=tokens.dtype, device=tokens.device)
        counts = torch.zeros(block.shape[0], dtype=torch.int64, device=tokens.device)
        block[first], counts[first] = tokens, lengths
        last = self.forward_cached(block, torch.zeros_like(counts), cache, counts, last=True)
        copies = first[rows] != slots
        if bool(copies.any()):
            cache.move(first[rows][copies], slots[copies], int(lengths.max()))
        return last[first]

    def _prefill_whole(self, tokens: Tensor, slots: Tensor, cache: KVCache, rows: Tensor) -> Tensor:
        """`prefill` by torch's attention over the whole padded rows (a cache without the native kernel)."""
        x = self.embed_tokens(tokens)
        cos, sin = self._rope(torch.arange(tokens.shape[1], device=tokens.device), x.dtype)
        for i, layer in enumerate(self.blocks):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, (cache, i, slots, rows))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self._logits(x)

    def forward_cached(self, tokens: Tensor, start: Tensor, cache: KVCache, counts: Tensor | None = None,
                       last: bool = False) -> Tensor:
        """Append `tokens` [S, W] to cache slots 0..S-1 at positions start[s]..; logits [S, W, V], or
        with `last` only each slot's last real token's [S, V] (zeros for a slot given none).

        `counts[s]` (default W) is how many of row s's tokens are real: only those are computed and
        cached, the rest of the row is padding whose logits come back as zeros. Projections and the
        MLP run on the real tokens alone, so a batch of ragged drafts costs what its tokens cost,
        not rows x longest draft.
        """
        cells = Cells.build(start, tokens.shape[1], cache.max_len, counts, self.cfg.kv_heads,
                            self.embed_tokens.weight.dtype)
        x = self.embed_tokens(cells.unpad(tokens))
        cos = self.rope_cos[cells.positions].to(x.dtype).unsqueeze(1)
        sin = self.rope_sin[cells.positions].to(x.dtype).unsqueeze(1)
        for i, layer in enumerate(self.blocks):
            x = x + layer.self_attn.forward_cached(layer.input_layernorm(x), cos, sin, cache, i, cells)
            x = x + padded_rows(layer.mlp.forward_rows, layer.post_attention_layernorm(x))
        if not last:
            return cells.pad(padded_rows(self._logits, x))
        ends = torch.cumsum(cells.counts, 0) - 1
        real = cells.counts > 0
        out: Tensor = x.new_zeros(cells.shape[0], self.cfg.vocab_size)
        out[real] = padded_rows(self._logits, x[ends[real]])
        return out


def rope_frequencies(cfg: ModelConfig) -> Tensor:
    """RoPE's inverse frequencies [head_dim / 2] in float64, with Llama 3's scaling where the config asks for
    it (as transformers computes them)."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    between = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, between, scaled)


def load_model(folder: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> TinyLlama:
    """The model in `folder`; a ModelError names the file when config.json or the weights are unusable."""
    check_native(folder)
    cfg = read_config(folder)
    model = TinyLlama(cfg)
    try:
        model.load_hf_state_dict({k: v.float() for k, v in read_weights(folder).items()})
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
        raise ModelError(f"{folder / 'model.safetensors'}: does not match {folder / 'config.json'}: {first}") from None
    return model.to(device=device, dtype=dtype)


def param_count_str(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.0f}K"


