"""Fine-tuning data prepared once: documents to packed fixed-length blocks, written as shards
plus a manifest, and read back by index.

`records` (pure) turns one record of any supported format into segments that do or do not carry
the loss; `sources` lists and reads the files of a source (local, s3://) and fingerprints them;
`pipeline` runs reading and tokenizing as a Ray Data pipeline and packs its ordered output into
shards; `manifest` is the dataset's description and its checks; `shards` writes, verifies and
reads the blocks; `index` says which rows are train and which are eval, by index alone.
"""
