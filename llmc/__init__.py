"""
The pieces of llm.pyx's training run, as llm.c's llmc/: data loader, tokenizer, sampler,
learning rate schedulers, logger, checkpoints and the default data; train.py puts them together.
"""
