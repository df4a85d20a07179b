"""Hugging Face export and import: a run's checkpoint as a transformers model folder with the CompleteP multipliers
folded into the weights (`export`), and such a folder, or a stock Llama or GPT-NeoX one, as a run directory
(`importer`). The export needs only safetensors' numpy API; torch and transformers load the folder."""
