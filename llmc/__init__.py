"""
The pieces of llm.pyx's training run, as llm.c's llmc/: data loader, tokenizer, sampler,
learning rate schedulers, logger, checkpoints and the default data; the file formats
(llmc/formats/) and the model families by name (families.py); train.py puts them together.
"""
