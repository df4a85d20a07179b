"""CelerityForCausalLM: an exported Celerity model in plain torch, for transformers with trust_remote_code=True.

A pre-norm decoder: x ← x + Attn(Norm x); x ← x + MLP(Norm x); logits = Norm(x) · lm_headᵀ. Every CompleteP
multiplier is folded into the weights by the export, so nothing here scales by anything but the attention's
1/sqrt(head_dim). Covers every architecture celerity_jax's ModelConfig expresses: ALiBi, RoPE (the two halves
rotated) or learned positions; LayerNorm or RMSNorm; squared-ReLU, SwiGLU, GELU or tanh-GELU MLPs, or a mixture
of such MLPs (hash or top-k router, with a capacity that drops routes); with or without biases. Norms, scores,
softmax and the router run in float32, as in celerity_jax.

Shapes: B batch, L new tokens, S cached + new tokens, D hidden, H heads, G key/value heads, K head_dim, F MLP width,
V vocab; in a mixture E experts, R experts per token (routes).
Keys and values go into transformers' Cache (`past_key_values`), so `generate()` decodes with a KV cache; ALiBi
biases and the causal mask are taken over cache slots, and a 2D attention_mask (padding) removes slots.
A mixture dispatches the tokens of each call: a prefill takes the prompt as one sequence, each decoded token is a
sequence of one (never dropped), as celerity_jax's cached decoding does. Where routes can be dropped, a decoded
token's logits can differ from those of a forward pass over the whole text, whose capacity is that of its length;
the config's capacity_factor None (from_pretrained(..., capacity_factor=None)) drops nothing. Padding takes routes
as any token does.
"""

import math

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_celerity import CelerityConfig

_MASKED = -1e30  # as celerity_jax: finite, so a query with every slot masked gets no NaN

ACTIVATIONS = {
    "squared_relu": lambda h: torch.square(torch.relu(h)),
    "gelu": lambda h: nn.functional.gelu(h),
    "gelu_tanh": lambda h: nn.functional.gelu(h, approximate="tanh"),
}


def alibi_slopes(n_heads: int) -> list[float]:
    """2^(−8k/n) for a power of two n; otherwise those of the lower power of two, then every other slope of the
    next one (celerity_jax.model.positions.alibi_slopes)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]

    low = 2 ** math.floor(math.log2(n_heads))
    return geometric(low) + geometric(2 * low)[0::2][: n_heads - low]


def rotate(x_BxHxLxK, cos_Bx1xLxK, sin_Bx1xLxK):
    """RoPE on the two halves of each head's features."""
    x1, x2 = x_BxHxLxK.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos_Bx1xLxK - x2 * sin_Bx1xLxK, x1 * sin_Bx1xLxK + x2 * cos_Bx1xLxK], dim=-1)
    return out.to(x_BxHxLxK.dtype)


class Norm(nn.Module):
    def __init__(self, config: CelerityConfig):
        super().__init__()
        self.layernorm, self.eps = config.norm == "layernorm", config.norm_eps
        self.weight = nn.Parameter(torch.ones(config.hidden_size))
        self.bias = nn.Parameter(torch.zeros(config.hidden_size)) if self.layernorm and config.use_bias else None

    def forward(self, x_BxLxD):
        h = x_BxLxD.float()
        if self.layernorm:
            h = h - h.mean(-1, keepdim=True)
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
        if self.bias is not None:
            h = h + self.bias.float()
        return h.to(x_BxLxD.dtype)


class Attention(nn.Module):
    def __init__(self, config: CelerityConfig, layer_idx: int):
        super().__init__()
        self.layer_idx, self.n_heads, self.head_dim = layer_idx, config.num_attention_heads, config.head_dim
        self.n_kv_heads = config.num_key_value_heads or config.num_attention_heads
        d, bias = config.hidden_size, config.use_bias
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj, self.v_proj = (nn.Linear(d, self.n_kv_heads * self.head_dim, bias=bias) for _ in range(2))
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=bias)

    def forward(self, x_BxLxD, bias_BxHxLxS, rope, past_key_values):
        b, l, _ = x_BxLxD.shape
        heads = lambda t, n: t.view(b, l, n, self.head_dim).transpose(1, 2)  # noqa: E731
        q = heads(self.q_proj(x_BxLxD), self.n_heads)
        k, v = heads(self.k_proj(x_BxLxD), self.n_kv_heads), heads(self.v_proj(x_BxLxD), self.n_kv_heads)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)  # the cache holds the G key/value heads
        group = self.n_heads // self.n_kv_heads  # query head h reads key/value head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores_BxHxLxS = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.head_dim**-0.5 + bias_BxHxLxS
        probs_BxHxLxS = torch.softmax(scores_BxHxLxS, dim=-1).to(v.dtype)
        out_BxLxD = torch.matmul(probs_BxHxLxS, v).transpose(1, 2).reshape(b, l, -1)
        return self.o_proj(out_BxLxD)


class Mlp(nn.Module):
    def __init__(self, config: CelerityConfig):
        super().__init__()
        d, f, bias = config.hidden_size, config.intermediate_size, config.use_bias
        self.gated = config.mlp == "swiglu"
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.gate_proj = nn.Linear(d, f, bias=bias) if self.gated else None
        self.act = nn.functional.silu if self.gated else ACTIVATIONS[config.mlp]
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x_BxLxD):
        h_BxLxF = self.up_proj(x_BxLxD)
        h_BxLxF = self.act(self.gate_proj(x_BxLxD)) * h_BxLxF if self.gated else self.act(h_BxLxF)
        return self.down_proj(h_BxLxF)


def token_hash(input_ids_BxL):
    """celerity_jax's hash of token ids: the upper 16 bits of id · 2654435761 mod 2^32."""
    return ((input_ids_BxL.long() * 2654435761) & 0xFFFFFFFF) >> 16


def expert_capacity(config: CelerityConfig, seq_len: int) -> int:
    """The most routes an expert takes from one sequence (celerity_jax.model.moe.expert_capacity)."""
    if config.capacity_factor is None:
        return seq_len
    share = config.capacity_factor * seq_len * config.experts_per_token / config.n_experts
    return min(seq_len, max(1, math.ceil(share)))


class MixtureOfExperts(nn.Module):
    """Each token's R routes: router "hash" sends it to expert hash(id) mod E with gate 1, "topk" to the router's R
    most probable experts, gated by their probabilities (divided by their sum with normalize_gates). An expert takes
    at most `expert_capacity` routes of a sequence, in order of position and then rank; the rest are dropped (add
    nothing)."""

    def __init__(self, config: CelerityConfig):
        super().__init__()
        self.config = config
        self.router = nn.Linear(config.hidden_size, config.n_experts, bias=False) if config.router == "topk" else None
        self.experts = nn.ModuleList(Mlp(config) for _ in range(config.n_experts))

    def forward(self, x_BxLxD, input_ids_BxL):
        rows, seq_len, d = x_BxLxD.shape
        g = self.config.expert_group_len
        l = g if g is not None and seq_len % g == 0 else seq_len  # each group of l positions dispatched on its own
        b = rows * seq_len // l
        x_BxLxD, input_ids_BxL = x_BxLxD.reshape(b, l, d), input_ids_BxL.reshape(b, l)
        e, r = self.config.n_experts, self.config.experts_per_token
        if self.router is None:
            expert_BxLxR = (token_hash(input_ids_BxL) % e)[..., None]
            gate_BxLxR = torch.ones(b, l, 1, device=x_BxLxD.device)
        else:
            probs_BxLxE = torch.softmax(x_BxLxD.float() @ self.router.weight.float().T, dim=-1)
            gate_BxLxR, expert_BxLxR = torch.topk(probs_BxLxE, r, dim=-1)
            if self.config.normalize_gates:
                gate_BxLxR = gate_BxLxR / gate_BxLxR.sum(-1, keepdim=True)
        routes_BxLRxE = nn.functional.one_hot(expert_BxLxR.reshape(b, l * r), e)
        slot_BxLR = ((routes_BxLRxE.cumsum(1) - 1) * routes_BxLRxE).sum(-1)  # each route's place in its expert's queue
        kept_BxLxR = (slot_BxLR < expert_capacity(self.config, l)).view(b, l, r)
        out_BxLxD = torch.zeros_like(x_BxLxD)
        for i, expert in enumerate(self.experts):
            row, pos, rank = torch.nonzero((expert_BxLxR == i) & kept_BxLxR, as_tuple=True)
            if len(row):  # a token takes an expert once at most, so (row, pos) repeats no place
                out_BxLxD[row, pos] += expert(x_BxLxD[row, pos]) * gate_BxLxR[row, pos, rank, None].to(x_BxLxD.dtype)
        return out_BxLxD.reshape(rows, seq_len, d)


class Block(nn.Module):
    def __init__(self, config: CelerityConfig, layer_idx: int):
        super().__init__()
        self.attn_norm, self.attn = Norm(config), Attention(config, layer_idx)
        self.mlp_norm = Norm(config)
        self.mlp = MixtureOfExperts(config) if config.n_experts > 1 else Mlp(config)

    def forward(self, x_BxLxD, input_ids_BxL, bias_BxHxLxS, rope, past_key_values):
        x_BxLxD = x_BxLxD + self.attn(self.attn_norm(x_BxLxD), bias_BxHxLxS, rope, past_key_values)
        h_BxLxD = self.mlp_norm(x_BxLxD)
        mixture = isinstance(self.mlp, MixtureOfExperts)
        return x_BxLxD + (self.mlp(h_BxLxD, input_ids_BxL) if mixture else self.mlp(h_BxLxD))


class CelerityPreTrainedModel(PreTrainedModel):
    config: CelerityConfig
    config_class = CelerityConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def _init_weights(self, module):
        # from_pretrained overwrites every weight; a fresh model starts from small normal matrices, unit norms
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Norm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


class CelerityModel(CelerityPreTrainedModel):
    def __init__(self, config: CelerityConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.positions == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = Norm(config)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None):
        b, l = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + l, device=input_ids.device)[None].expand(b, l)
        x_BxLxD = self.embed_tokens(input_ids)
        if self.config.positions == "learned":
            x_BxLxD = x_BxLxD + self.embed_positions(position_ids)
        rope = None
        if self.config.positions == "rope":
            k = self.config.head_dim
            inv_freq_K2 = self.config.rope_theta ** (-torch.arange(0, k, 2, device=input_ids.device).float() / k)
            angle_BxLxK2 = position_ids.float()[..., None] * inv_freq_K2
            rope = (angle_BxLxK2.cos()[:, None], angle_BxLxK2.sin()[:, None])
        bias_BxHxLxS = self._score_bias(b, l, past, attention_mask, input_ids.device)
        for block in self.layers:
            x_BxLxD = block(x_BxLxD, input_ids, bias_BxHxLxS, rope, past_key_values)
        return self.norm(x_BxLxD)

    def _score_bias(self, b: int, l: int, past: int, attention_mask, device):
        """Float32 bias_BxHxLxS on the scores: ALiBi's −slope·(i − j) (or 0) where slot j is visible to query i
        (j ≤ i and not padding), masked elsewhere."""
        query_L = torch.arange(past, past + l, device=device)
        dist_LxS = query_L[:, None] - torch.arange(past + l, device=device)[None, :]
        visible_BxLxS = (dist_LxS >= 0)[None].expand(b, l, past + l)
        if attention_mask is not None:
            visible_BxLxS = visible_BxLxS & attention_mask[:, None, -(past + l):].bool()
        bias_1xHxLxS = torch.zeros(1, 1, l, past + l, device=device)
        if self.config.positions == "alibi":
            slopes_H = torch.tensor(alibi_slopes(self.config.num_attention_heads), device=device)
            bias_1xHxLxS = -slopes_H[None, :, None, None] * dist_LxS.float()[None, None]
        return torch.where(visible_BxLxS[:, None], bias_1xHxLxS, torch.tensor(_MASKED, device=device))


class CelerityForCausalLM(CelerityPreTrainedModel, GenerationMixin):
    def __init__(self, config: CelerityConfig):
        super().__init__(config)
        self.model = CelerityModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, labels=None,
                use_cache=None, logits_to_keep=0, **kwargs):
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        x_BxLxD = self.model(input_ids, attention_mask, position_ids, past_key_values)
        logits_BxLxV = self.lm_head(x_BxLxD[:, -logits_to_keep:] if logits_to_keep else x_BxLxD).float()
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits_BxLxV, labels=labels, vocab_size=self.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits_BxLxV, past_key_values=past_key_values)
