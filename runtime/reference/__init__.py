"""The reference trainer `launcher init` copies into a new project (`trainer`: a small GPT on
deterministic data with exact resume), and what it is made of: the model (`model`), the data it
makes itself (`data`) and its exact data position (`cursor`: the order as f(seed, epoch)).
"""
