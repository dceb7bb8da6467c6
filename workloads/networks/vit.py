"""Vision Transformers (Dosovitskiy et al. 2021, arXiv:2010.11929, Table 1) as torchvision 0.28's
``vision_transformer.py`` builds them: a patch×patch/stride-patch convolution to the hidden size,
the patches as tokens, a learned class token before them and learned position embeddings added;
``num_layers`` pre-norm encoder blocks (layer norm, ``nn.MultiheadAttention`` on the fused
scaled-dot-product kernel under ``training.attention: flash``, or with the scores materialised under
``standard``, SDPA's math path; residual add, layer norm, MLP of two linears with GELU, residual add);
a final layer norm and a linear head on the class token. Dropouts default to 0 (identity).

Under ``precision: fp8`` the attention projections (``attention_proj``) and the MLP's two linears
(``mlp``) run in FP8 where ``training.fp8_gemms`` names their class, priced as a decoder transformer's
(workloads/graph.py ``Op.op_class``); the patch convolution stays in bf16 (no FP8 convolution is
measured, and Transformer Engine runs none) and so does the classifier head (no class)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from workloads.networks.builder import NetBuilder
from workloads.networks.spec import NetworkSpec


class ViTSpec(NetworkSpec):
    """A ViT: ViT-B/16 is 12 layers, 12 heads, hidden 768, MLP 3072; ViT-L/16 24, 16, 1024, 4096."""

    family: Literal["vit"] = "vit"
    image_size: int = Field(default=224, gt=0)
    patch_size: int = Field(default=16, gt=0)
    num_layers: int = Field(default=12, gt=0)
    num_heads: int = Field(default=12, gt=0)
    hidden_dim: int = Field(default=768, gt=0)
    mlp_dim: int = Field(default=3072, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    num_classes: int = Field(default=1000, gt=0)

    @model_validator(mode="after")
    def _shapes(self) -> ViTSpec:
        if self.image_size % self.patch_size:
            raise ValueError("image_size must be a multiple of patch_size")
        if self.hidden_dim % self.num_heads:
            raise ValueError("hidden_dim must be a multiple of num_heads")
        return self

    @property
    def tokens_per_sample(self) -> int:
        """(image / patch)^2 patches plus the class token: 197 for ViT-B/16 at 224 (the paper's sequence)."""
        return (self.image_size // self.patch_size) ** 2 + 1

    def _build(self, net: NetBuilder) -> None:
        x = net.input(3, self.image_size, self.image_size)
        x = net.conv2d("conv_proj", x, self.hidden_dim, self.patch_size, stride=self.patch_size, bias=True)
        x = net.prepend_token("class_token", net.tokens("patches", x))
        x = net.dropout("encoder.dropout", net.add_parameter("encoder.pos_embedding", x), self.dropout)
        for i in range(self.num_layers):
            name = f"encoder.layers.{i}"
            y = net.self_attention(f"{name}.self_attention", net.layernorm(f"{name}.ln_1", x), self.num_heads,
                                   proj_class="attention_proj")
            x = net.add(f"{name}.add_1", net.dropout(f"{name}.dropout", y, self.dropout), x)
            y = net.linear(f"{name}.mlp.0", net.layernorm(f"{name}.ln_2", x), self.mlp_dim, op_class="mlp")
            y = net.dropout(f"{name}.mlp.2", net.activation(f"{name}.mlp.1", y, "gelu"), self.dropout)
            y = net.dropout(f"{name}.mlp.4", net.linear(f"{name}.mlp.3", y, self.hidden_dim, op_class="mlp"),
                            self.dropout)
            x = net.add(f"{name}.add_2", x, y)
        x = net.select_token("class_token_out", net.layernorm("encoder.ln", x))
        net.linear("heads.head", x, self.num_classes)
