"""Models: load any local Hugging Face causal LM, or build the embedded tiny lab model."""
