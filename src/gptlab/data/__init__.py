"""Data: text corpora (built-in, files, Hugging Face datasets) into token shards, and the loader.

Not here: tokenization itself (gptlab.tokenizer).
"""
