"""A lean decode forward for Llama-family models, used by the HF engine when the model fits.

transformers' modelling code is written for every feature of every model; at decode's batch
sizes on a CPU (one token for each of ~32 rows) its per-call overhead (module calls, kwargs,
mask building, `repeat_kv` copying the whole cache per layer and step) costs about as much as
the matrix products themselves (docs/performance.md). This module runs the same mathematics
as `LlamaForCausalLM.forward` (Touvron et al. 2023; the transformers implementation is the
reference it is tested against) with fewer, larger operations:

- q, k and v come from one matrix product, gate and up from another, with weights copied
  once per `generate` call into the layout the CPU's GEMM reads fastest (`[in, out]`
  contiguous); the residual additions are fused into the o and down products (`addmm`);
- RoPE rotates q and k together, with cos/sin looked up from a table built once per call
  the way transformers builds them;
- keys and values live in one preallocated tensor per layer; decode attention groups the
  query heads that share a key/value head (GQA) instead of repeating the keys and values;
- the prefill runs the prompt once with a causal, padding-aware mask.

Supported: `model_type` llama (SmolLM2, Llama 2/3), qwen2, qwen3 and mistral, without sliding
windows, with static RoPE (default, linear, llama3, yarn), SiLU MLPs, plain `nn.Linear`
projections (biases allowed), tied or untied heads, no forward hooks (this path does not
call the modules). Qwen3's query/key norms (an RMSNorm over each head's vector, applied after
the projection and before RoPE: `Qwen3Attention.forward` in transformers) run here too. Anything
else (`unsupported_reason` says why) runs through the transformers modules. A LoRA run's engine
decodes a plain copy of the model that each weight sync refreshes with the merged weights
(`reasonrl.placement`), so it takes this path as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reasonrl.accel.kernels import rms_norm

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def unsupported_reason(model) -> str | None:
    """None when `LeanLlama` can decode `model`; otherwise why not, in words."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of {ARCHITECTURES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (only silu)"
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "layer types other than full attention"
    inner = getattr(model, "model", None)
    if not isinstance(getattr(inner, "layers", None), nn.ModuleList) or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not a *ForCausalLM with model.layers (e.g. a LoRA wrapper)"
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return f"RoPE type {getattr(rotary, 'rope_type', None)!r} (only {STATIC_ROPE})"
    head = model.get_output_embeddings()
    linears = [head] + [m for layer in inner.layers for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
    if any(type(m) is not nn.Linear for m in linears):
        return "wrapped projections (e.g. LoRA adapters): not plain nn.Linear"
    norms = [getattr(layer.self_attn, name, None) for layer in inner.layers for name in ("q_norm", "k_norm")]
    if any(n is not None and not (isinstance(getattr(n, "weight", None), torch.Tensor)
                                  and hasattr(n, "variance_epsilon")) for n in norms):
        return "query/key norms that are not RMSNorms"
    if not head.weight.dtype.is_floating_point:
        return f"weights of dtype {head.weight.dtype}"
    hooked = next((name for name, m in model.named_modules()
                   if m._forward_hooks or m._forward_pre_hooks), None)
    if hooked is not None:  # the lean path does not call the modules, so their hooks would not run
        return f"forward hooks on {hooked or 'the model'}"
    return None


def mkl_packing() -> bool:
    """Whether this torch has MKL's packed GEMM (x86 builds with MKL)."""
    return (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"))


class _Matrix:
    """A projection `x @ W.T (+ b)`, with W [out, in] in the layout the device's GEMM reads
    fastest at decode's few rows (docs/performance.md, measured at 32 rows on this project's
    CPU):

    - CPU, fp32, MKL: W packed by MKL for a number of rows (`pack(rows)`; `_mkl_linear`),
      ~140-155 GFLOP/s against 80-115 for a plain product: fewer rows are padded up to the
      packed count (the decoder repacks when they fall below half of it);
    - other CPUs: `[in, out]` contiguous, and for wide outputs (> 1024 columns) column blocks
      `[out / block, in, block]` in one batched product (the [576 x 3072] gate/up weight runs
      at 54 GFLOP/s whole and 90 in blocks of 512);
    - GPU, and every call with more rows than packed (the prefill): `F.linear` with W itself.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, block: int = 512, mkl: bool = True):
        self.weight = weight.detach()  # [out, in]
        self.out_features, self.bias = self.weight.size(0), bias
        cpu = self.weight.device.type == "cpu"
        self.packable = mkl and cpu and self.weight.dtype == torch.float32 and mkl_packing()
        self.packed: torch.Tensor | None = None
        self.rows = 0
        self.block = block if cpu and not self.packable and self.out_features > 1024 else 0
        self.layout: torch.Tensor | None = None
        if self.block:
            blocks = -(-self.out_features // block)
            padded = torch.cat([self.weight, self.weight.new_zeros(blocks * block - self.out_features,
                                                                   self.weight.size(1))])
            self.layout = padded.view(blocks, block, -1).transpose(1, 2).contiguous()  # [blocks, in, block]
        elif cpu and not self.packable:
            self.layout = self.weight.t().contiguous()  # [in, out]

    def pack(self, rows: int) -> None:
        """Pack W for products of `rows` rows (MKL only; otherwise nothing to do)."""
        if self.packable and rows != self.rows:
            self.packed = None  # free the old packing first
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows)
            self.rows = rows

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., in] -> [..., out]; `residual` (same shape as the output) added."""
        shape = x.shape[:-1]
        x2 = x.reshape(-1, x.size(-1))
        m = x2.size(0)
        res = None if residual is None else residual.reshape(m, self.out_features)
        if self.packed is not None and m <= self.rows:
            if m < self.rows:
                x2 = F.pad(x2, (0, 0, 0, self.rows - m))
            out = torch.ops.mkl._mkl_linear(x2, self.packed, self.weight, self.bias, self.rows)[:m]
            out = out if res is None else out.add_(res)
        elif self.block:
            out = torch.matmul(x2, self.layout)  # [blocks, rows, block]
            out = out.transpose(0, 1).reshape(m, -1)[:, : self.out_features]
            out = out if res is None else out + res
            out = out if self.bias is None else out + self.bias
        elif self.layout is not None:
            out = x2 @ self.layout if res is None else torch.addmm(res, x2, self.layout)
            out = out if self.bias is None else out + self.bias
        else:
            out = F.linear(x2, self.weight, self.bias)
            out = out if res is None else out.add_(res)
        return out.view(*shape, self.out_features)


def _matrix(*linears: nn.Linear, block: int = 512, mkl: bool = True) -> _Matrix:
    """The projections' weights stacked along the output (q, k, v -> qkv) as one `_Matrix`."""
    weight = torch.cat([m.weight.detach() for m in linears]) if len(linears) > 1 else linears[0].weight
    bias = None
    if any(m.bias is not None for m in linears):
        bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                          for m in linears])
    return _Matrix(weight, bias, block, mkl)


class _Layer:
    """One decoder layer's weights in the fused layout (copies: the model is untouched)."""

    def __init__(self, layer, mkl: bool = True):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _matrix(attn.q_proj, attn.k_proj, attn.v_proj, mkl=mkl)
        self.o = _matrix(attn.o_proj, mkl=mkl)
        self.gate_up = _matrix(mlp.gate_proj, mlp.up_proj, mkl=mkl)
        self.down = _matrix(mlp.down_proj, mkl=mkl)
        self.norm1, self.eps1 = layer.input_layernorm.weight.detach(), layer.input_layernorm.variance_epsilon
        self.norm2 = layer.post_attention_layernorm.weight.detach()
        self.eps2 = layer.post_attention_layernorm.variance_epsilon
        self.scaling = attn.scaling
        # Qwen3: RMSNorm of each query / key head before RoPE (None: Llama, Qwen2, Mistral)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.q_norm = None if q_norm is None else (q_norm.weight.detach(), q_norm.variance_epsilon)
        self.k_norm = None if k_norm is None else (k_norm.weight.detach(), k_norm.variance_epsilon)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [..., D] through the layer's per-head query/key norms, where it has them."""
        if self.q_norm is not None:
            q = _rms_norm(q, *self.q_norm)
        if self.k_norm is not None:
            k = _rms_norm(k, *self.k_norm)
        return q, k


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm(x, weight, eps)[0]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE (Su et al. 2021; transformers' apply_rotary_pos_emb): x * cos + rotate_half(x) * sin,
    with rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2) = cat(x2, x1) * sin_signed."""
    half = x.size(-1) // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin_signed


def _causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """[G, S, S] bool from valid [G, S]: a query sees the earlier valid tokens and itself (a
    padding query sees only itself, so its softmax stays finite)."""
    s = valid.size(1)
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(s, dtype=torch.bool, device=valid.device)
    return (causal & valid[:, None, :]) | eye


def length_groups(lengths: list[int], waste: float = 0.25) -> list[list[int]]:
    """Row indices grouped by similar length, longest first: a group grows while padding
    every row to its longest stays within `waste` x the group's real tokens. Batching
    keeps the matrix products large; the grouping keeps padding (compute spent on nothing)
    small: the bench's 8 GSM8K prompts of 55-135 tokens are 37 % padding as one batch."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    groups: list[list[int]] = []
    for r in order:
        if groups:
            group = groups[-1]
            longest = lengths[group[0]]
            if longest * (len(group) + 1) <= (1 + waste) * (sum(lengths[i] for i in group) + lengths[r]):
                group.append(r)
                continue
        groups.append([r])
    return groups


class LeanLlama:
    """The decode state of one `generate` call: fused weights, RoPE tables, KV cache.

    `prefill(ids, mask)` runs left-padded prompts [P, W] and returns the last position's
    logits [P, V]; `repeat(n)` gives each prompt n rows; `step(tokens)` appends one token per
    row and returns the next logits [B, V]; `select(rows)` keeps only those rows.
    """

    def __init__(self, model, max_len: int, mkl: bool = True):
        config, inner = model.config, model.model
        self.layers = [_Layer(layer, mkl) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight.detach()
        self.norm, self.norm_eps = inner.norm.weight.detach(), inner.norm.variance_epsilon
        self.head = _matrix(model.get_output_embeddings(), block=256, mkl=mkl)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.max_len = max_len
        # RoPE tables for positions 0..max_len-1, built exactly as LlamaRotaryEmbedding does
        rotary = inner.rotary_emb
        positions = torch.arange(max_len, device=self.embed.device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(device=self.embed.device, dtype=torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * rotary.attention_scaling).to(self.embed.dtype)
        sin = (emb.sin() * rotary.attention_scaling).to(self.embed.dtype)
        half = self.head_dim // 2
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2): see _rotate
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        self.cache: torch.Tensor | None = None  # [layers, 2, B, kv_heads, max_len, head_dim]
        self.key_ok: torch.Tensor | None = None  # [B, 1, 1, max_len] bool: columns a query may see
        self.length = 0  # filled cache columns
        self.positions: torch.Tensor | None = None  # [B] the next token's position

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., heads, S, D] rotated at positions [..., S]."""
        return _rotate(x, self.cos[positions].unsqueeze(-3), self.sin_signed[positions].unsqueeze(-3))

    def _split(self, qkv: torch.Tensor):
        """[B, S, (H + 2K) D] -> q [B, H, S, D], k [B, K, S, D], v [B, K, S, D]."""
        b, s = qkv.shape[:2]
        h, k, d = self.heads, self.kv_heads, self.head_dim
        qkv = qkv.view(b, s, h + 2 * k, d).transpose(1, 2)
        return qkv[:, :h], qkv[:, h: h + k], qkv[:, h + k:]

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_rms_norm(x, self.norm, self.norm_eps))

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ids [P, W] with mask [P, W] (1 = token): fills the cache and
        returns the logits [P, V] at each prompt's last position. Prompts run in groups of
        similar length (`length_groups`), each padded only to its own longest prompt."""
        p, w = ids.shape
        if w > self.max_len:
            raise ValueError(f"prompt of {w} tokens exceeds the decode length {self.max_len}")
        lengths = mask.sum(1)
        if int(lengths.min()) < 1:
            raise ValueError("an empty prompt cannot be decoded")
        shape = (len(self.layers), 2, p, self.kv_heads, self.max_len, self.head_dim)
        self.cache = self.embed.new_zeros(shape)  # columns no prompt fills stay 0: finite under the mask
        logits = self.embed.new_empty((p, self.head.out_features))
        for rows in length_groups(lengths.tolist()):
            index = torch.tensor(rows, device=ids.device)
            width = int(lengths[index].max())
            logits[index] = self._prefill_group(index, ids[index, w - width:], mask[index, w - width:], w)
        self.length = w
        self.positions = lengths.clone()
        self.key_ok = torch.ones(p, 1, 1, self.max_len, dtype=torch.bool, device=ids.device)
        self.key_ok[:, 0, 0, :w] = mask.bool()
        return logits

    def _prefill_group(self, rows: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                       end: int) -> torch.Tensor:
        """Prompts `rows`, left-padded to their own width: their keys and values go to cache
        columns [end - width, end); returns the last position's logits."""
        w = ids.size(1)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        attn_mask = None if bool(mask.all()) else _causal_mask(mask.bool())[:, None]  # None: plain causal
        return self._new_tokens(ids, positions, attn_mask, rows, end - w, end, past=False)

    def _new_tokens(self, ids: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor | None,
                    rows, start: int, end: int, past: bool) -> torch.Tensor:
        """The layers over new tokens `ids` [G, S] of cache `rows` (an index or a slice): their
        keys and values go to cache columns [start, end); they attend to each other alone, or
        with `past` to the cache's columns [0, end). Returns the logits at the last column."""
        x = F.embedding(ids, self.embed)
        for i, layer in enumerate(self.layers):
            q, k, v = self._split(layer.qkv(_rms_norm(x, layer.norm1, layer.eps1)))
            q, k = layer.norm_qk(q, k)
            q, k = self._rope(q, positions), self._rope(k, positions)
            self.cache[i, 0, rows, :, start: end] = k
            self.cache[i, 1, rows, :, start: end] = v
            if past:
                k, v = self.cache[i, 0, rows, :, :end], self.cache[i, 1, rows, :, :end]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                                 scale=layer.scaling, enable_gqa=self.heads != self.kv_heads)
            x = self._mlp(layer, layer.o(out.transpose(1, 2).reshape(*ids.shape, -1), x))
        return self._head(x[:, -1])

    def rows_cache(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """The keys and values of `rows` (indices into the current batch), their filled columns
        only: one [layers, 2, kv_heads, n, head_dim] tensor per row, n = the row's tokens fed
        so far (what `prefill` of those tokens would write). `prefill_cached` takes them back."""
        ok = self.key_ok[:, 0, 0, : self.length]
        return [self.cache[:, :, r, :, : self.length].index_select(3, ok[r].nonzero().squeeze(1))
                for r in rows.tolist()]

    def prefill_cached(self, past: list[torch.Tensor], ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Like `prefill`, for rows whose first tokens are already computed: row i's `past[i]`
        ([layers, 2, kv_heads, n_i, head_dim] from `rows_cache`, n_i >= 0) is followed by its
        new tokens, left-padded in `ids` / `mask` [P, S]. Only the new tokens are run, attending
        to their past and causally to each other; returns the logits [P, V] at each row's last
        token. Layout: the pasts fill columns [C - n_i, C) (C = the longest past), the new
        tokens [C, C + S); the padding between is masked, and positions continue from n_i."""
        p, s = ids.shape
        done = torch.tensor([kv.size(3) for kv in past], device=ids.device)
        c = int(done.max())
        if c + s > self.max_len:
            raise ValueError(f"{c + s} cached and new tokens exceed the decode length {self.max_len}")
        shape = (len(self.layers), 2, p, self.kv_heads, self.max_len, self.head_dim)
        self.cache = self.embed.new_zeros(shape)
        for i, kv in enumerate(past):
            self.cache[:, :, i, :, c - kv.size(3): c] = kv
        self.key_ok = torch.ones(p, 1, 1, self.max_len, dtype=torch.bool, device=ids.device)
        self.key_ok[:, 0, 0, :c] = torch.arange(c, device=ids.device) >= (c - done)[:, None]
        self.key_ok[:, 0, 0, c: c + s] = mask.bool()
        positions = done[:, None] + (mask.cumsum(1) - 1).clamp(min=0)
        attn_mask = torch.cat([self.key_ok[:, 0, :, :c].expand(p, s, c), _causal_mask(mask.bool())], dim=2)
        logits = self._new_tokens(ids, positions, attn_mask[:, None], slice(None), c, c + s, past=True)
        self.length = c + s
        self.positions = done + mask.sum(1)
        return logits

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = layer.gate_up(_rms_norm(x, layer.norm2, layer.eps2)).chunk(2, -1)
        return layer.down(F.silu(gate) * up, x)

    def repeat(self, n: int) -> None:
        """Each row becomes n consecutive rows (a prompt's n samples share its prefill)."""
        self.cache = self.cache.repeat_interleave(n, dim=2)
        self.key_ok = self.key_ok.repeat_interleave(n, dim=0)
        self.positions = self.positions.repeat_interleave(n, dim=0)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (indices into the current batch), in this order.

        Rows ending one by one call this up to once per row: rows in increasing order (the
        decode loop's) move down in place and only their filled columns are copied, so a call
        costs rows x filled columns, not the whole preallocated cache (rows x the decode length,
        twice over with a new cache: ~1.6 GB per ended row at 32 rows x 1,100 positions of
        SmolLM2-135M)."""
        ordered = rows.numel() < 2 or bool((rows[1:] > rows[:-1]).all())
        if not ordered:
            self.cache = self.cache.index_select(2, rows)
        else:
            for j, r in enumerate(rows.tolist()):  # r >= j: a source is never overwritten before it is read
                if r != j:
                    self.cache[:, :, j, :, : self.length].copy_(self.cache[:, :, r, :, : self.length])
            self.cache = self.cache[:, :, : rows.numel()]
        self.key_ok = self.key_ok.index_select(0, rows)
        self.positions = self.positions.index_select(0, rows)

    def _matrices(self) -> list[_Matrix]:
        per_layer = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return per_layer + [self.head]

    def _pack_for(self, rows: int) -> None:
        """Keep the MKL packing fit for `rows` rows: packed once for the first decode step's
        batch, repacked when the rows still decoding fall below half of it (padding up to
        twice the work is cheaper than repacking at every finished row: ~0.35 s a packing)."""
        packed = self.head.rows
        if not self.head.packable or (packed and rows <= packed < 2 * rows):
            return
        for m in self._matrices():
            m.pack(rows)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One new token per row [B]: appends its keys/values, returns the logits [B, V]."""
        if self.length >= self.max_len:
            raise ValueError(f"decode length {self.max_len} exceeded")
        b, col = tokens.size(0), self.length
        self._pack_for(b)
        h, k, d = self.heads, self.kv_heads, self.head_dim
        g = h // k
        x = F.embedding(tokens, self.embed)  # [B, hidden]
        cos = self.cos[self.positions].unsqueeze(1)  # [B, 1, D]
        sin = self.sin_signed[self.positions].unsqueeze(1)
        key_ok = self.key_ok[..., : col + 1]
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(_rms_norm(x, layer.norm1, layer.eps1)).view(b, h + 2 * k, d)
            if layer.q_norm is None and layer.k_norm is None:
                qk = qkv[:, : h + k]
            else:
                qk = torch.cat(layer.norm_qk(qkv[:, :h], qkv[:, h: h + k]), dim=1)
            qk = _rotate(qk, cos, sin)  # q and k heads together
            cache = self.cache[i]
            cache[0, :, :, col] = qk[:, h:]
            cache[1, :, :, col] = qkv[:, h + k:]
            # the g query heads of a key/value head attend as g "positions" of one sequence
            q = qk[:, :h].reshape(b, k, g, d)
            out = F.scaled_dot_product_attention(q, cache[0, :, :, : col + 1], cache[1, :, :, : col + 1],
                                                 attn_mask=key_ok, scale=layer.scaling)
            x = layer.o(out.reshape(b, h * d), x)
            x = self._mlp(layer, x)
        self.length += 1
        self.positions = self.positions + 1
        return self._head(x)
