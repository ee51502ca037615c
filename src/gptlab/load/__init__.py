"""Load: a model a user names (a run, a checkpoint, a Hugging Face folder), found and loaded with its tokenizer.

Below every stage that starts from a model (eval, train, align, export, serve and their commands), so none of them
depends on another to load one. Imports model, tokenizer and data (the tokenizer saved beside a model).
"""
