"""Tools: a tiny random Llama with an offline tokenizer and data, for quickstarts and tests."""
