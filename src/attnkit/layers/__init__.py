"""The Transformer's parts, one concept per module. Layers take explicit sizes and never read a config."""
