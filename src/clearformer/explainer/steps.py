"""What each recorded step means: a title, a formula (plain text and LaTeX), named dimensions.

Dimension names: B batch, T tokens (Tq queries, Tk keys), H heads, Dh head width, D model
width, Dff feed-forward width. The formulas depend on how the model is built (norm placement,
activation, final norm), so :func:`step_info` takes that context.

``anchor`` picks the source line shown for a step: the nearest line above the record call in the
same function that contains the anchor text. Without an anchor (or when the anchor is not
found) the statement just before the record call is shown, skipping other record calls.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFacts:
    """The parts of a model's build that change what a step computes."""

    norm: str = "pre"  # "pre" | "post"
    activation: str = "relu"
    gated: bool = False
    final_norm: bool = True
    embedding_norm: bool = False
    token_types: bool = False
    pooling: str | None = None  # "mean" | "cls" | "max" | None
    normalize: bool = False


@dataclass(frozen=True)
class StepInfo:
    name: str
    title: str
    formula: str  # plain text, one line
    latex: str
    about: str  # why the step exists, one sentence
    dims: tuple[str, ...]
    anchor: str | None = None


_ACT_TEXT = {
    "relu": ("ReLU(u) = max(u, 0)", r"\mathrm{ReLU}(u) = \max(u, 0)"),
    "gelu": ("GELU(u) = u·Φ(u)  (exact, erf)", r"\mathrm{GELU}(u) = u\,\Phi(u)"),
    "gelu_tanh": ("GELU_tanh(u)  (tanh approximation)", r"\mathrm{GELU}_{\tanh}(u)"),
    "swiglu": ("SiLU(g) ⊙ v", r"\mathrm{SiLU}(g) \odot v"),
    "geglu": ("GELU(g) ⊙ v", r"\mathrm{GELU}(g) \odot v"),
    "geglu_tanh": ("GELU_tanh(g) ⊙ v", r"\mathrm{GELU}_{\tanh}(g) \odot v"),
}

# Order of the steps inside one block; renderers and the --step filter use these names.
BLOCK_STEPS = (
    "block.input",
    "block.attn_input",
    "attn.q_proj",
    "attn.k_proj",
    "attn.v_proj",
    "attn.split_heads",
    "attn.scores",
    "attn.biased_scores",
    "attn.masked_scores",
    "attn.weights",
    "attn.context",
    "attn.merge_heads",
    "attn.out_proj",
    "block.attn_residual",
    "block.mlp_input",
    "ffn.hidden",
    "ffn.activation",
    "ffn.output",
    "block.mlp_residual",
)
EDGE_STEPS = ("embeddings.sum", "embeddings.output", "encoder.output", "pooling", "normalize")
STEP_NAMES = (*EDGE_STEPS[:2], *BLOCK_STEPS, *EDGE_STEPS[2:])


def step_info(name: str, facts: ModelFacts) -> StepInfo:
    """The meaning of step ``name`` in a model built as ``facts`` says."""
    table = _table(facts)
    if name not in table:
        # A record point this version does not describe yet: still shown, with its raw name.
        return StepInfo(name, name, name, name, "", ())
    return table[name]


def _table(f: ModelFacts) -> dict[str, StepInfo]:
    pre = f.norm == "pre"
    act_text, act_latex = _ACT_TEXT.get(f.activation, (f.activation, f.activation))
    types = " + E_type[segment]" if f.token_types else ""
    types_tex = r" + E_{\mathrm{type}}[s]" if f.token_types else ""
    hidden_dims = ("B", "T", "2Dff") if f.gated else ("B", "T", "Dff")
    steps = [
        StepInfo(
            "embeddings.sum",
            "token + position embeddings",
            f"x = E_word[id] + E_pos[t]{types}",
            rf"x = E_{{\mathrm{{word}}}}[\mathrm{{id}}] + E_{{\mathrm{{pos}}}}[t]{types_tex}",
            "Each token id becomes a learned vector; adding a position vector tells the "
            "otherwise order-blind attention where the token sits.",
            ("B", "T", "D"),
            anchor="x = x + self.position(",
        ),
        StepInfo(
            "embeddings.output",
            "embedding norm" if f.embedding_norm else "embeddings out",
            "x = Dropout(LayerNorm(x))" if f.embedding_norm else "x = Dropout(x)",
            r"x = \mathrm{Dropout}(\mathrm{LN}(x))" if f.embedding_norm else "x",
            "The residual stream the first block reads; dropout is the identity in eval mode.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "block.input",
            "residual stream in",
            "x  (the residual stream entering this block)",
            r"x^{(\ell)}",
            "Every block reads and writes this one stream of D numbers per token.",
            ("B", "T", "D"),
            anchor="def encoder_block(",
        ),
        StepInfo(
            "block.attn_input",
            "norm before attention" if pre else "attention input",
            "h = LayerNorm₁(x)" if pre else "h = x  (post-norm: attention reads the stream)",
            r"h = \mathrm{LN}_1(x)" if pre else "h = x",
            "Pre-norm normalises a copy for attention and leaves the stream itself untouched."
            if pre
            else "Post-norm normalises after the residual sum instead.",
            ("B", "T", "D"),
            anchor="h = block.attn_norm(x)" if pre else "attention(block.attn, x, mask",
        ),
        StepInfo(
            "attn.q_proj",
            "queries",
            "Q = h W_Qᵀ + b_Q",
            r"Q = h W_Q^\top + b_Q",
            "What each token is looking for. Q, K and V come from one fused matrix product.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "attn.k_proj",
            "keys",
            "K = h W_Kᵀ + b_K",
            r"K = h W_K^\top + b_K",
            "What each token offers to be found by.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "attn.v_proj",
            "values",
            "V = h W_Vᵀ + b_V",
            r"V = h W_V^\top + b_V",
            "What each token passes on when it is attended to.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "attn.split_heads",
            "split into heads",
            "Q, K, V: (B, T, D) → (B, H, T, Dh),  Dh = D / H  (shown: Q)",
            r"Q: B \times T \times D \to B \times H \times T \times D_h",
            "Each head attends in its own Dh-wide subspace; the split is a view, no copy.",
            ("B", "H", "T", "Dh"),
        ),
        StepInfo(
            "attn.scores",
            "scaled scores",
            "S = Q Kᵀ / √Dh",
            r"S = \frac{Q K^\top}{\sqrt{D_h}}",
            "One score per (query, key) and head; dividing by √Dh keeps their variance near 1 "
            "so the softmax does not saturate.",
            ("B", "H", "Tq", "Tk"),
        ),
        StepInfo(
            "attn.biased_scores",
            "relative position bias",
            "S[i, j] += b_h(bucket(j - i))",
            r"S_{ij} \mathrel{+}= b_h(\mathrm{bucket}(j - i))",
            "Each head adds a learned score for the distance between query and key (MPNet; "
            "T5-style buckets, exact for short distances, logarithmic beyond).",
            ("B", "H", "Tq", "Tk"),
        ),
        StepInfo(
            "attn.masked_scores",
            "mask",
            "S[i, j] = min_float where key j does not take part",
            r"S_{ij} = \min_{\mathrm{float}} \ \text{where}\ m_{ij} = 0",
            "Padded keys get the most negative finite score, so the softmax gives them nothing.",
            ("B", "H", "Tq", "Tk"),
        ),
        StepInfo(
            "attn.weights",
            "softmax",
            "A = softmax_j(S)   (masked keys: exactly 0)",
            r"A_{ij} = \frac{e^{S_{ij}}}{\sum_k e^{S_{ik}}}",
            "Each query's weights over the keys are positive and sum to 1.",
            ("B", "H", "Tq", "Tk"),
            anchor="F.softmax(",
        ),
        StepInfo(
            "attn.context",
            "weighted sum of values",
            "C = A V",
            r"C = A V",
            "Each query gets the average of the values, weighted by its attention.",
            ("B", "H", "T", "Dh"),
        ),
        StepInfo(
            "attn.merge_heads",
            "merge heads",
            "C: (B, H, T, Dh) → (B, T, D)  (heads side by side)",
            r"C = [C_1; \dots; C_H]",
            "The heads' results are concatenated back into one D-wide vector per token.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "attn.out_proj",
            "output projection",
            "O = C W_Oᵀ + b_O",
            r"O = C W_O^\top + b_O",
            "Mixes the heads' results and maps them back into the residual stream.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "block.attn_residual",
            "add to the stream" if pre else "add and norm",
            "x = x + Dropout(O)" if pre else "x = LayerNorm₁(x + Dropout(O))",
            r"x = x + \mathrm{Dropout}(O)"
            if pre
            else r"x = \mathrm{LN}_1(x + \mathrm{Dropout}(O))",
            "The residual connection: attention adds to the stream rather than replacing it; "
            "dropout is the identity in eval mode.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "block.mlp_input",
            "norm before feed-forward" if pre else "feed-forward input",
            "h = LayerNorm₂(x)" if pre else "h = x",
            r"h = \mathrm{LN}_2(x)" if pre else "h = x",
            "The feed-forward network reads a normalised copy of the stream."
            if pre
            else "Post-norm: the stream was normalised by the step before.",
            ("B", "T", "D"),
            anchor="h = block.mlp_norm(x)" if pre else "x = block.attn_norm(x + ",
        ),
        StepInfo(
            "ffn.hidden",
            "expand",
            "[g, v] = h W₁ᵀ + b₁" if f.gated else "u = h W₁ᵀ + b₁",
            r"[g, v] = h W_1^\top + b_1" if f.gated else r"u = h W_1^\top + b_1",
            "Each token alone is lifted into a wider space (no mixing between tokens here).",
            hidden_dims,
        ),
        StepInfo(
            "ffn.activation",
            "activation",
            f"a = {act_text}",
            f"a = {act_latex}",
            "The non-linearity: without it the two linear maps would collapse into one.",
            ("B", "T", "Dff"),
            anchor="h = mlp.act(gate) * value" if f.gated else "h = mlp.act(h)",
        ),
        StepInfo(
            "ffn.output",
            "project back",
            "f = a W₂ᵀ + b₂",
            r"f = a W_2^\top + b_2",
            "Back to width D, ready to add to the stream.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "block.mlp_residual",
            "add to the stream" if pre else "add and norm",
            "x = x + Dropout(f)" if pre else "x = LayerNorm₂(x + Dropout(f))",
            r"x = x + \mathrm{Dropout}(f)"
            if pre
            else r"x = \mathrm{LN}_2(x + \mathrm{Dropout}(f))",
            "The block's output: the next block reads it.",
            ("B", "T", "D"),
        ),
        StepInfo(
            "encoder.output",
            "final norm" if f.final_norm else "encoder output",
            "y = LayerNorm_final(x)" if f.final_norm else "y = x  (no final norm)",
            r"y = \mathrm{LN}_{\mathrm{final}}(x)" if f.final_norm else "y = x",
            "Pre-norm stacks never normalise the stream itself, so one norm closes the stack; "
            "padded positions are then set to zero."
            if f.final_norm
            else "Padded positions are then set to zero.",
            ("B", "T", "D"),
        ),
        _pooling_info(f.pooling),
        StepInfo(
            "normalize",
            "unit length",
            "e = p / ‖p‖₂",
            r"e = \frac{p}{\lVert p \rVert_2}",
            "Unit-length embeddings make the dot product a cosine similarity.",
            ("B", "D"),
        ),
    ]
    return {s.name: s for s in steps}


def _pooling_info(pooling: str | None) -> StepInfo:
    if pooling == "cls":
        text, latex, about = "p = y[:, 0]", "p = y_0", "The first token's vector stands for all."
    elif pooling == "max":
        text, latex = "p = max_t y_t over real tokens", r"p = \max_{t : m_t} y_t"
        about = "The largest value of each feature over the real tokens."
    else:
        text = "p = Σ_t m_t y_t / Σ_t m_t"
        latex = r"p = \frac{\sum_t m_t\, y_t}{\sum_t m_t}"
        about = "The average over the real tokens (m = 1), so padding does not dilute it."
    return StepInfo("pooling", f"{pooling or 'mean'} pooling", text, latex, about, ("B", "D"))
