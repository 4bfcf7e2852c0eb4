"""The data stages: corpus, tokenizer, prepare (the TFRecord shards) and the input pipeline.

Also holds the bundled demo corpus (corpus.txt.gz) as package data.
"""
