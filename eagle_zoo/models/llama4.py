"""The llama4 family (target model, EAGLE heads, mapping table): being written."""
