"""Which layers of a decoder are MoE layers: one rule for every family.

Families spell the choice differently; all are one predicate over a layer's number:

* ``first_k_dense``: layers 0 .. first_k_dense - 1 keep a dense MLP (DeepSeek-V3's
  ``first_k_dense_replace``: the shallow layers route badly and cost little dense);
* ``sparse_step``: only every n-th layer is sparse, counting from 1 (Qwen3-MoE's
  ``decoder_sparse_step``);
* ``dense_layers``: named layers stay dense (Qwen3-MoE's ``mlp_only_layers``).
"""

from __future__ import annotations

from collections.abc import Collection


def is_moe_layer(layer_id: int, *, num_experts: int, first_k_dense: int = 0, sparse_step: int = 1,
                 dense_layers: Collection[int] = ()) -> bool:
    """Whether layer ``layer_id`` (numbered from 0) has experts instead of a dense MLP."""
    return (num_experts > 0 and layer_id >= first_k_dense and layer_id not in dense_layers
            and (layer_id + 1) % sparse_step == 0)
