"""The imaging layer, where pixels are made: reading and admitting a file, decoding (every CPU
and GPU engine), the crop plan, the resize and the flip, and what decoded each image. Loaders
compose these; none decodes or resizes on its own."""
