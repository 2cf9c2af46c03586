"""Building blocks the model plugins share, and what the core does with any model's weights:
the SwiGLU feed-forward, init rules and common config fields (``model_parts``), the float32
RMSNorm and dense/MoE parameter and FLOP counts (``decoder``), Hugging Face names and config
fields (``hf_names``), layout-independent weight init (``init``), tied weights
(``ties``), the default loss (``loss``), the optional KV cache and sampling for generation
(``kv_cache``, ``sampling``).

Each module imports only ``errors`` (and ``config``): a model plugin can use any of them without
pulling in the runtime.
"""
