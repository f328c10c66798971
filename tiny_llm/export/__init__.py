"""Trained models leave the pipeline: Hugging Face export, text generation, sample tables.

- ``settings`` (torch-free): sampling settings and prompt files, validated with one line per problem.
- ``weights``: a checkpoint's weights (ordinary, packed average or one packed worker) as our model or as
  Hugging Face Llama tensors.
- ``generate``: sampling with a KV cache (greedy at temperature 0), reproducible for a seed.
- ``tokenizer`` (torch-free): the token cache's tokenizer as files ``AutoTokenizer`` loads.
- ``hf``: the export directory (config.json, model.safetensors, generation_config.json, tokenizer, README.md).
- ``gguf_file``: ``model.gguf`` for llama.cpp (``export --gguf``), written with the ``gguf`` package.
- ``card`` (torch-free): the model card, with the deliberate differences from transformers' own files.
- ``samples`` (torch-free): tables of exported models and their sample continuations for the report.
"""
