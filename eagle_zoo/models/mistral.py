"""The mistral family (target model, EAGLE heads, mapping table): being written."""
