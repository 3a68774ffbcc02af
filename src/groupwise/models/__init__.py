"""Models: load any local Hugging Face causal LM (``load.py``, ``sources.py``), or build the embedded tiny lab model
(``tiny.py``); LoRA adapters (``lora.py``), FSDP sharding (``fsdp.py``), the teacher-forced forward the update,
teachers and probes share (``forward.py``), warm starts (``warm_start.py``) and exports (``export.py``). What the
stages below need to know of a model (whether it is a LoRA adapter, and the base under it) is ``adapters.py``."""
