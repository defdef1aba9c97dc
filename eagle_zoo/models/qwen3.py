"""The qwen3 family (target model, EAGLE heads, mapping table): being written."""
