"""SGLang integration of the tiered KV cache: the only package that imports sglang."""
